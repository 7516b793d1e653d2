"""`coscale.modules.prefetch` without a server: which requests sampled ahead a batch takes,
the staleness setting's range, and the refusals that name it."""

from __future__ import annotations

import io
from concurrent.futures import Future

import pytest
import torch

from coscale.modules.grpo_settings import UpdateSettings
from coscale.modules.prefetch import Prefetch, batch_ids, sample_ahead
from coscale.rollout.base import Rollouts


class _Pending:
    def __init__(self, version: int, result=None, error: Exception | None = None) -> None:
        self.version, self.future = version, Future()
        if error is None:
            self.future.set_result(result)
        else:
            self.future.set_exception(error)

    def result(self):
        return self.future.result()


def _batch(*ids: str, n: int = 4) -> list[dict]:
    return [{"id": i, "question": "q", "n": n} for i in ids]


def test_a_batch_takes_only_requests_sent_for_its_position_and_its_problems():
    ahead = Prefetch()
    first, second = _Pending(1), _Pending(1)
    ahead.add((0, 1), _batch("a", "b"), first)
    ahead.add((0, 2), _batch("c", "d"), second)
    assert (0, 1) in ahead and len(ahead) == 2
    assert ahead.take((0, 1), _batch("a", "b")) is first
    # the batch at position 2 changed (its N did): sampled again, never with the old N
    assert ahead.take((0, 2), _batch("c", "d", n=8)) is None
    assert len(ahead) == 0


def test_requests_for_positions_passed_over_are_dropped():
    ahead = Prefetch()
    ahead.add((0, 3), _batch("a"), _Pending(2))
    ahead.add((1, 0), _batch("b"), _Pending(2))
    assert ahead.take((1, 0), _batch("b")) is not None  # a new epoch: (0, 3) is gone
    assert len(ahead) == 0
    ahead.add((1, 1), _batch("c"), _Pending(3))
    ahead.clear()
    assert len(ahead) == 0


def _rollouts(texts: list[str]) -> Rollouts:
    r = len(texts)
    return Rollouts(
        prompt_index=torch.zeros(r, dtype=torch.long),
        input_ids=torch.ones(r, 3, dtype=torch.long),
        attention_mask=torch.ones(r, 3, dtype=torch.long),
        completion_mask=torch.ones(r, 2),
        logprobs=torch.full((r, 2), -0.5),
        texts=texts,
        finish_reasons=["stop"] * r,
        prompt_length=1,
        logprob_source="engine",
    )


def test_what_is_out_at_a_checkpoint_is_saved_sampled_and_restored_as_old_as_it_was():
    ahead = Prefetch()
    ahead.add((0, 2), _batch("c"), _Pending(4, result=_rollouts(["1", "2"])))  # sync 4's
    ahead.add((0, 3), _batch("d"), _Pending(4, error=RuntimeError("server gone")))
    state = ahead.state_dict(version=5)  # saved after the step's sync (5)
    assert [(e["key"], e["ids"], e["lag"]) for e in state] == [([0, 2], ["c:4"], 1)]  # failed: out
    buffer = io.BytesIO()
    torch.save({"prefetched": [state]}, buffer)
    buffer.seek(0)
    (saved,) = torch.load(buffer, weights_only=True)["prefetched"]  # a safe load reads it
    resumed = Prefetch()
    resumed.load_state_dict(saved)
    resumed.rebase(1)  # the resumed fit's first sync: the checkpoint's weights
    pending = resumed.take((0, 2), _batch("c"))
    assert pending.version == 0  # one sync older than the weights now: staleness 1, as before
    got = pending.result()
    assert got.texts == ["1", "2"] and torch.equal(got.logprobs, _rollouts(["1", "2"]).logprobs)
    assert resumed.take((0, 3), _batch("d")) is None  # requested again


def test_batch_ids_hold_the_problems_and_their_n_in_order():
    assert batch_ids(_batch("a", "b")) == ("a:4", "b:4")
    assert batch_ids(_batch("b", "a")) != batch_ids(_batch("a", "b"))


def test_max_staleness_must_be_a_non_negative_int():
    assert UpdateSettings(max_staleness=-1).errors() == [
        "max_staleness must be an int >= 0, got -1"
    ]
    assert UpdateSettings(max_staleness=2).errors() == []


def test_a_backend_that_cannot_sample_in_the_background_is_refused_naming_the_setting():
    class Module:
        backend = type("Cached", (), {"name": "cached"})()
        update_settings = UpdateSettings(max_staleness=1)

    with pytest.raises(ValueError, match=r"update\.max_staleness=1 needs .*vllm-server.*'cached'"):
        sample_ahead(Module(), _batch("a"))
