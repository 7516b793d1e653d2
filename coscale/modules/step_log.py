"""What a GRPO step logs: ``train/`` (rewards, signal, lengths, the update's statistics, what the
reward functions logged) and ``perf/`` (step time, generation share), and a table of completions
every ``log_completions_every`` steps. Also the step's context for the reward functions
(:func:`reward_context`): TRL's ``trainer_state`` and the sinks of ``log_extra`` / ``log_metric``."""

from __future__ import annotations

import math

from coscale.scoring.reward_context import RewardContext, RewardLog, TrainerState


def reward_context(module, batch_idx: int) -> RewardContext:
    """The context the reward functions of ``module``'s (a GRPOModule's) training step get: the
    trainer's progress under TRL's names, a fresh log, the policy's device."""
    trainer = module._trainer
    if trainer is None:
        return RewardContext(device=module.device)
    batches = trainer.num_training_batches
    within = batch_idx / batches if isinstance(batches, int) and batches > 0 else 0.0
    state = TrainerState(
        global_step=module.global_step,
        epoch=trainer.current_epoch + within,  # TRL: epochs done, with the current one's share
        max_steps=max(trainer.max_steps, 0),
        num_train_epochs=max(trainer.max_epochs or 0, 0),
        is_world_process_zero=module.global_rank == 0,
    )
    return RewardContext(state, RewardLog(), module.device)


def log_step(
    module, batch, rollouts, scores, adv, stats, gen_s, step_s, reward_log: RewardLog | None = None
) -> None:
    """Logs one step of ``module`` (a GRPOModule): rewards (the weighted sum, each function's
    mean, the verifier's share correct), advantages' signal, lengths, the update's ``stats``
    (loss, clipping, KL, entropy, mismatch weights, grad norm), timings and each metric the
    reward functions logged (``train/<name>``, the mean of the step's values); now and then a
    table of completions, with the columns the reward functions logged."""
    n, rewards = len(batch), scores.reward
    module.log("train/reward", rewards.mean(), prog_bar=True, batch_size=n)
    module.log("train/correct", scores.correct.float().mean(), batch_size=n)
    for name, value in scores.means().items():
        module.log(f"train/rewards/{name}", value, batch_size=n)
    module.log("train/frac_zero_std", adv.zero_std_fraction, batch_size=n)
    module.log("train/skipped", stats.pop("skipped", 0.0), batch_size=n)
    module.log("train/completion_len", rollouts.lengths.float().mean(), batch_size=n)
    truncated = sum(r == "length" for r in rollouts.finish_reasons) / len(rewards)
    module.log("train/truncated", truncated, batch_size=n)
    module.log("train/rollouts", float(len(rewards)), batch_size=n, reduce_fx="sum")
    for key, value in stats.items():
        module.log(f"train/{key}", value, batch_size=n)
    for name, value in (reward_log.metric_means() if reward_log else {}).items():
        if math.isfinite(value):
            module.log(f"train/{name}", value, batch_size=n)
    module.log("perf/step_s", step_s, batch_size=n)
    module.log("perf/generation_frac", gen_s / max(step_s, 1e-9), batch_size=n)
    if module.log_completions_every and module.global_step % module.log_completions_every == 0:
        from coscale.modules.tables import log_completions

        extra = dict(reward_log.extra) if reward_log else {}
        log_completions(module, batch, rollouts, scores, adv.advantages, extra)
