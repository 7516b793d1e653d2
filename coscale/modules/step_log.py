"""What a GRPO step logs: ``train/`` (rewards, signal, lengths, the update's statistics) and
``perf/`` (step time, generation share), and a table of completions every
``log_completions_every`` steps."""

from __future__ import annotations


def log_step(module, batch, rollouts, scores, adv, stats, gen_s, step_s) -> None:
    """Logs one step of ``module`` (a GRPOModule): rewards (the weighted sum, each function's
    mean, the verifier's share correct), advantages' signal, lengths, the update's ``stats``
    (loss, clipping, KL, entropy, mismatch weights, grad norm) and timings; now and then a table
    of completions."""
    n, rewards = len(batch), scores.reward
    module.log("train/reward", rewards.mean(), prog_bar=True, batch_size=n)
    module.log("train/correct", scores.correct.float().mean(), batch_size=n)
    for name, value in scores.means().items():
        module.log(f"train/rewards/{name}", value, batch_size=n)
    module.log("train/frac_zero_std", adv.zero_std_fraction, batch_size=n)
    module.log("train/skipped", stats.pop("skipped", 0.0), batch_size=n)
    module.log("train/completion_len", rollouts.lengths.float().mean(), batch_size=n)
    module.log(
        "train/truncated",
        sum(r == "length" for r in rollouts.finish_reasons) / len(rewards),
        batch_size=n,
    )
    module.log("train/rollouts", float(len(rewards)), batch_size=n, reduce_fx="sum")
    for key, value in stats.items():
        module.log(f"train/{key}", value, batch_size=n)
    module.log("perf/step_s", step_s, batch_size=n)
    module.log("perf/generation_frac", gen_s / max(step_s, 1e-9), batch_size=n)
    if module.log_completions_every and module.global_step % module.log_completions_every == 0:
        from coscale.modules.tables import log_completions

        log_completions(module, batch, rollouts, rewards, adv.advantages)
