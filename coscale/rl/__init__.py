"""GRPO's parts: group advantages, policy losses, log-probabilities, and the theory of N_eff and lr/N."""
