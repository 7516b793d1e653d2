"""The vLLM rollout backend: a colocated engine per rank that samples and follows the policy's
weights (`VLLMBackend`, `coscale.rollout.vllm.backend`), one file an idea: the settings, the
engine adapter, requests and rollouts, weight sync, parity, LoRA, launch and host, the CPU build.

Nothing here imports vllm until an engine is built. Only `coscale.rollout.factory` imports this
package (`tests/test_architecture.py`); choose the backend there (``rollout.backend: vllm``).
"""
