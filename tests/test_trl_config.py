"""A TRL ``GRPOConfig`` as coscale settings (``coscale.integrations.trl``): each translated field
lands where the docs say, as a ``GRPOConfig`` object, a dict or its YAML file; the settings are
valid coscale settings; the loss pairs give the classes of docs/losses.md; batch sizes carry over
per rank; every field coscale cannot take is refused, all named in one error; and
docs/trl-grpo-config.md lists every field of ``GRPOConfig`` with what the code does with it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trl import GRPOConfig

from coscale.checks import as_group
from coscale.integrations.trl import from_grpo_config
from coscale.integrations.trl_fields import ACCEPTED, HINTS, TRANSLATED, grpo_config_defaults
from coscale.modules.grpo import GROUPS, settings_errors
from coscale.rl.losses import CISPOLoss, DAPOLoss, DrGRPOLoss, GRPOLoss, GSPOLoss, as_loss

ROOT = Path(__file__).resolve().parents[1]
TABLE_PAGE = ROOT / "docs" / "trl-grpo-config.md"

SET_UP = {  # a TRL user's GRPO settings, most of them away from TRL's defaults
    "output_dir": "runs/trl",
    "learning_rate": 1e-5,
    "adam_beta1": 0.5,
    "weight_decay": 0.01,
    "warmup_steps": 0.1,  # a share of max_steps
    "lr_scheduler_type": "constant_with_warmup",
    "max_steps": 50,
    "logging_steps": 5,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "num_generations": 4,
    "max_completion_length": 64,
    "temperature": 0.9,
    "top_p": 0.95,
    "top_k": 20,
    "beta": 0.04,
    "use_bias_correction_kl": False,
    "epsilon": 3e-4,
    "epsilon_high": 4e-4,
    "loss_type": "grpo",
    "importance_sampling_level": "sequence",
    "scale_rewards": False,
    "mask_truncated_completions": True,
    "num_iterations": 2,
    "reward_weights": [1.0, 0.5],
    "log_completions": True,
    "chat_template_kwargs": {"enable_thinking": False},
    "use_vllm": True,
    "vllm_enable_sleep_mode": True,
    "vllm_gpu_memory_utilization": 0.4,
    "vllm_importance_sampling_mode": "token_truncate",
    "vllm_importance_sampling_clip_max": 2.0,
    "gradient_checkpointing": False,
    "model_init_kwargs": {"dtype": "bfloat16"},
    "seed": 7,
    "use_cpu": True,
    "bf16": False,
    "report_to": "wandb",  # accepted: the Trainer's logger is the user's
}


def test_a_trl_set_up_lands_where_the_docs_say():
    s = from_grpo_config(SET_UP)
    grpo = s["grpo"]
    assert grpo["optimizer"] == {
        "lr": 1e-5,
        "betas": [0.5, 0.999],
        "weight_decay": 0.01,
        "warmup_steps": 5,
        "decay": "constant",
    }
    for kind, decay in [("linear", "linear"), ("cosine", "cosine"), ("constant", "constant")]:
        optimizer = from_grpo_config(SET_UP | {"lr_scheduler_type": kind})["grpo"]["optimizer"]
        assert optimizer["decay"] == decay
    assert grpo["sampling"] == {
        "max_new_tokens": 64,
        "temperature": 0.9,
        "top_p": 0.95,
        "top_k": 20,
        "seed": 7,
    }
    assert grpo["update"] == {
        "num_iterations": 2,
        "micro_batch_size": 8,
        "max_grad_norm": 1.0,
        "scale_rewards": "none",
        "mask_truncated": True,
    }
    assert grpo["load"] == {
        "dtype": "bfloat16",
        "gradient_checkpointing": False,
        "trust_remote_code": False,
    }
    assert grpo["loss"] == {
        "class_path": "coscale.rl.losses.GSPOLoss",
        "init_args": {
            "beta": 0.04,
            "entropy_coef": 0.0,
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
            "mismatch": {"mode": "truncate", "level": "token", "cap": 2.0},
        },
    }
    engine = {"gpu_memory_utilization": 0.4, "max_model_len": None, "sleep_level": 2}
    assert grpo["rollout"] == {"backend": "vllm", "options": {"engine": engine}}
    assert grpo["reward_weights"] == [1.0, 0.5] and grpo["log_completions_every"] == 5
    # 8 rollouts a micro-batch x 2 accumulated = 16 rollouts a step = 4 problems x N = 4
    curriculum = {"rl_unmeasured": True, "low": 0.0, "seed": 7}
    assert s["data"] == {"batch_size": 4, "curriculum": curriculum}
    assert s["trainer"] == {
        "log_every_n_steps": 5,
        "max_steps": 50,
        "default_root_dir": "runs/trl",
        "precision": "32-true",
        "accelerator": "cpu",
    }
    assert s["schedule"] == {"n_init": 4, "factor": 1.0} and s["seed_everything"] == 7  # fixed N
    assert s["prompt"] == {"chat_template_kwargs": {"enable_thinking": False}}


def test_the_settings_are_valid_coscale_settings():
    grpo = from_grpo_config(SET_UP)["grpo"]
    groups = {k: as_group(GROUPS[k], v) for k, v in grpo.items() if k in GROUPS}
    assert settings_errors(reward_weights=[1.0, 0.5], reward=[len, len], **groups) == []
    loss = as_loss(grpo["loss"])
    assert isinstance(loss, GSPOLoss) and loss.beta == 0.04 and loss.epsilon_high == 4e-4
    assert (loss.mismatch.mode, loss.mismatch.level, loss.mismatch.cap) == ("truncate", "token", 2)


def test_a_grpo_config_object_a_dict_and_a_yaml_file_give_the_same(tmp_path):
    kept = {k: v for k, v in SET_UP.items() if k not in ("use_vllm", "vllm_enable_sleep_mode")}
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(kept))
    from_object = from_grpo_config(GRPOConfig(**kept))  # __post_init__ has filled fields in
    assert from_object == from_grpo_config(kept) == from_grpo_config(str(path))


@pytest.mark.parametrize(
    ("loss_type", "level", "cls", "extra"),
    [
        ("grpo", "token", GRPOLoss, {}),
        ("grpo", "sequence", GSPOLoss, {}),
        ("dapo", "token", DAPOLoss, {}),
        ("bnpo", "token", DAPOLoss, {}),
        ("dr_grpo", "token", DrGRPOLoss, {"max_tokens": 64}),
        ("cispo", "token", CISPOLoss, {"max_weight": 5.0}),
    ],
)
def test_each_trl_loss_becomes_the_coscale_class_with_the_same_numbers(
    loss_type, level, cls, extra
):
    given = {"loss_type": loss_type, "importance_sampling_level": level}
    given |= {"max_completion_length": 64, "epsilon_high": 5.0 if loss_type == "cispo" else 0.3}
    spec = from_grpo_config(given)["grpo"]["loss"]
    loss = as_loss(spec)
    assert type(loss) is cls
    assert {k: spec["init_args"][k] for k in extra} == extra
    if cls is not CISPOLoss:
        assert (loss.epsilon, loss.epsilon_high) == (0.2, 0.3)


def test_batch_sizes_are_per_rank_and_one_optimiser_step_per_batch():
    # 64 completions a generation over 2 ranks, groups of 8: 4 problems a step on each rank
    given = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}
    settings = from_grpo_config(given | {"num_generations": 8}, num_processes=2)
    assert settings["data"]["batch_size"] == 4
    with pytest.raises(ValueError, match=r"steps_per_generation=8 with gradient_accumulation_st"):
        from_grpo_config(given | {"generation_batch_size": 128}, num_processes=2)


def test_trl_server_mode_attaches_to_the_server_it_names():
    server = {"use_vllm": True, "vllm_mode": "server"}
    rollout = from_grpo_config(server)["grpo"]["rollout"]
    assert rollout == {
        "backend": "vllm-server",
        "options": {"server": {"url": "http://127.0.0.1:8000"}},
    }
    named = server | {"vllm_server_host": "gpu-node-3", "vllm_server_port": 8011}
    url = from_grpo_config(named)["grpo"]["rollout"]["options"]["server"]["url"]
    assert url == "http://gpu-node-3:8011"
    based = named | {"vllm_server_base_url": "http://10.0.0.5:9000/"}
    url = from_grpo_config(based)["grpo"]["rollout"]["options"]["server"]["url"]
    assert url == "http://10.0.0.5:9000"


def test_everything_coscale_cannot_take_is_refused_at_once_and_named():
    bad = {
        "delta": 1.5,  # refused, with a hint
        "push_to_hub": True,
        "neftune_noise_alpha": 5.0,  # refused, no hint
        "loss_type": "sapo",  # a choice coscale does not have
        "vllm_tensor_parallel_size": 2,
        "beta": 0.1,  # with use_bias_correction_kl's default True
        "num_train_epochs": 1.5,
        "model_init_kwargs": {"dtype": "bfloat16", "attn_implementation": "sdpa"},
        "reward_funcs": ["x"],  # not a GRPOConfig field
        "save_steps": 7,  # accepted: no error
    }
    with pytest.raises(ValueError) as caught:
        from_grpo_config(bad)
    message = str(caught.value)
    for expected in [
        "reward_funcs is not a field of GRPOConfig",
        "delta=1.5 has no coscale meaning (TRL's default None): two-sided clipping",
        "push_to_hub=True has no coscale meaning",
        "neftune_noise_alpha=5.0 has no coscale meaning (TRL's default None)",
        "loss_type='sapo': coscale takes 'grpo' or 'dr_grpo' or 'dapo' or 'bnpo' or 'cispo'",
        "vllm_tensor_parallel_size=2: coscale takes 1",
        "use_bias_correction_kl=True with beta > 0",
        "num_train_epochs=1.5: coscale takes a whole number here",
        "model_init_kwargs.attn_implementation has no coscale meaning",
    ]:
        assert expected in message
    assert "save_steps" not in message


def render_table() -> str:
    """docs/trl-grpo-config.md's table, from the code's classification."""
    rows = ["| field | TRL default | in coscale |", "|---|---|---|"]
    for name, default in grpo_config_defaults().items():
        if name in TRANSLATED:
            what = f"translated: {TRANSLATED[name]}"
        elif name in ACCEPTED:
            what = f"accepted, no effect: {ACCEPTED[name]}"
        else:
            what = "refused unless default" + (f": {HINTS[name]}" if name in HINTS else "")
        rows.append(f"| `{name}` | `{default!r}` | {what} |")
    return "\n".join(rows) + "\n"


def test_the_docs_list_every_grpo_config_field_with_what_the_code_does():
    page = TABLE_PAGE.read_text()
    start = page.index("| field | TRL default | in coscale |")
    table = page[start : page.index("\n\n", start) + 1]
    assert table == render_table(), "regenerate the table: python tests/test_trl_config.py"
    assert len(table.splitlines()) == 2 + len(grpo_config_defaults())  # every field, once


if __name__ == "__main__":  # writes the table into the page (between its first two blank lines)
    page = TABLE_PAGE.read_text()
    start = page.index("| field | TRL default | in coscale |")
    end = page.index("\n\n", start) + 1
    TABLE_PAGE.write_text(page[:start] + render_table() + page[end:])


def test_a_translated_config_becomes_a_coscale_run_pipeline():
    from coscale.integrations.trl import from_grpo_config
    from coscale.integrations.trl_pipeline import pipeline_settings
    from coscale.pipeline import PipelineSettings

    given = {"max_completion_length": 64, "temperature": 0.8, "top_p": 0.9, "num_generations": 4}
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    settings = from_grpo_config({**given, **kwargs, "use_cpu": True, "bf16": False})
    pipe = pipeline_settings(settings)
    prompt = pipe["sampling"].pop("prompt")
    assert pipe["sampling"] == {"max_new_tokens": 64, "temperature": 0.8, "top_p": 0.9, "top_k": 0}
    assert prompt["chat_template_kwargs"] == {"enable_thinking": False}
    pipe["sampling"]["prompt"] = prompt
    assert pipe["grpo"]["sampling"] == {"seed": 42} and "validation" not in pipe["grpo"]
    cfg = PipelineSettings(model="m", **pipe)  # nothing refused: each setting stated once
    assert cfg.sampling.max_new_tokens == 64 and cfg.schedule == {"n_init": 4}
    assert cfg.sampling.prompt.chat_template_kwargs == {"enable_thinking": False}
    assert settings["grpo"]["sampling"]["max_new_tokens"] == 64  # the input is left as it was
