"""A sequence-classification model as a reward (``coscale.scoring.reward_model``): its scores are
the model's own first logit on prompt + completion, batched (against a direct forward of each text
alone), chat-templated for conversational prompts, equal to TRL 1.16's reward-model branch of
``_calculate_rewards``; built from a folder named in the reward list (Python and YAML), named as
TRL names it, refused with the bad argument named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification
from trl_reference import stand_in, trl_rewards

from coscale.models.tiny import build_char_tokenizer
from coscale.scoring.reward_context import RewardContext
from coscale.scoring.reward_functions import RewardInputs
from coscale.scoring.reward_model import RewardModel
from coscale.scoring.reward_set import RewardSet

TINY = Path(__file__).resolve().parents[1] / "configs" / "run" / "tiny.yaml"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPTS = ["Q: 2+3?", "Q: 2+3?", "Q: 10-4?"]
COMPLETIONS = ["5", "it is 6, I think", "6"]
MESSAGES = [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}] for p in PROMPTS
]


@pytest.fixture(scope="module")
def scorer():
    """A 1-layer random Llama sequence classifier (one label) and its char tokenizer, with a
    ChatML chat template; the tokenizer pads on the left, as coscale's policies do."""
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHATML
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return LlamaForSequenceClassification(config).eval(), tokenizer


@pytest.fixture(scope="module")
def scorer_dir(scorer, tmp_path_factory):
    model, tokenizer = scorer
    path = tmp_path_factory.mktemp("math-rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def inputs(conversational: bool) -> RewardInputs:
    return RewardInputs(
        prompts=PROMPTS,
        completions=COMPLETIONS,
        completion_ids=[[1]] * 3,
        answers=["5", "5", "6"],
        prompt_messages=MESSAGES if conversational else None,
    )


def direct(model, tokenizer, text: str) -> float:
    """The model's first logit on ``text`` alone: no padding, no batch."""
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids).logits[0, 0])


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_scores_are_the_models_logit_on_prompt_and_completion(scorer, conversational):
    model, tokenizer = scorer
    if conversational:  # the whole conversation through the template, no generation prompt
        texts = [
            tokenizer.apply_chat_template([*m, {"role": "assistant", "content": c}], tokenize=False)
            for m, c in zip(MESSAGES, COMPLETIONS)
        ]
        assert texts[0].endswith("<|im_start|>assistant\n5<|im_end|>\n")
    else:
        texts = [p + c for p, c in zip(PROMPTS, COMPLETIONS)]
    expected = [direct(model, tokenizer, t) for t in texts]
    rm = RewardModel(model, tokenizer, batch_size=2)  # 2 + 1: padding in the first batch
    got = RewardSet(rm).score(inputs(conversational)).per_function[:, 0]
    assert got.tolist() == pytest.approx(expected, abs=1e-5)
    assert len(set(expected)) == 3  # the texts score apart: the check can fail


@pytest.mark.parametrize("conversational", [False, True], ids=["standard", "conversational"])
def test_scores_equal_trls_reward_model_branch(scorer, conversational):
    model, tokenizer = scorer
    x = inputs(conversational)
    trl_args = x.trl_arguments()
    rows = [{"prompt": p} for p in trl_args["prompts"]]
    trainer = stand_in([model], processing_classes=[tokenizer])
    expected = trl_rewards(trainer, rows, trl_args["prompts"], trl_args["completions"], [[1]] * 3)
    got = RewardSet(RewardModel(model, tokenizer, batch_size=3)).score(x).per_function
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)


def test_a_folder_in_the_reward_list_is_a_reward_model_with_its_own_tokenizer(scorer_dir, scorer):
    model, tokenizer = scorer
    rewards = RewardSet([str(scorer_dir), lambda completions, answers: [1.0] * len(completions)])
    rm = rewards.functions[0].fn
    assert isinstance(rm, RewardModel) and rewards.names[0] == scorer_dir.name  # TRL's name
    assert rm.tokenizer.chat_template == CHATML  # loaded from the folder
    scores = rewards.score(inputs(True), RewardContext(device=torch.device("cpu")))
    expected = RewardSet(RewardModel(model, tokenizer)).score(inputs(True)).per_function
    assert torch.allclose(scores.per_function[:, :1], expected, atol=1e-6, rtol=0)
    assert next(rm.model.parameters()).device == torch.device("cpu")


def test_a_reward_model_from_yaml_by_class_path(scorer_dir, tmp_path):
    from coscale.app.run_config import build_run
    from coscale.pipeline import Pipeline

    extra = tmp_path / "rm.yaml"
    extra.write_text(
        "pipeline:\n  logger: none\n  grpo:\n    reward:\n"
        "      - class_path: coscale.scoring.reward_model.RewardModel\n"
        f"        init_args: {{model: {scorer_dir}, batch_size: 2, name: rm}}\n"
        f"      - {scorer_dir}\n"  # a plain folder, as TRL takes one
        "      - reward_examples.format_bonus\n"
        "    reward_weights: [1.0, 0.5, 0.5]\n"
    )
    argv = ["--config", str(TINY), "--config", str(extra), "--pipeline.run_dir", str(tmp_path)]
    reward = Pipeline(*build_run(argv)).ctx.grpo_args["reward"]
    rm = reward[0]
    assert isinstance(rm, RewardModel) and rm.batch_size == 2 and rm.__name__ == "rm"
    assert reward[1] == str(scorer_dir) and callable(reward[2])  # the folder stays a str ...
    rewards = RewardSet(reward, [1.0, 0.5, 0.5])  # ... until the module builds its rewards
    assert isinstance(rewards.functions[1].fn, RewardModel)
    assert rewards.names == ["rm", scorer_dir.name, "format_bonus"]


def test_bad_arguments_are_refused_naming_them(scorer, tmp_path):
    model, tokenizer = scorer
    with pytest.raises(ValueError, match=r"model must be .*got 3; batch_size must be an int >= 1"):
        RewardModel(3, batch_size=0)
    with pytest.raises(ValueError, match=r"dtype must be one of float32, bfloat16, float16"):
        RewardModel(model, tokenizer, dtype="int8")
    with pytest.raises(ValueError, match=r"model must be an existing folder, a hub id"):
        RewardModel(str(tmp_path / "nowhere"))  # a typo'd path is not sent to the hub
    with pytest.raises(ValueError, match=r"model='nobody/no-rm' does not load as a sequence-cl"):
        RewardModel("nobody/no-rm")  # offline here
    plain = build_char_tokenizer()  # no chat template
    with pytest.raises(ValueError, match=r"conversational prompts need a tokenizer with a chat"):
        RewardModel(model, plain).texts(MESSAGES, [[{"role": "assistant", "content": "5"}]] * 3)
