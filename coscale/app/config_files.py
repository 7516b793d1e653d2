"""``--config`` given more than once: a later file's mappings add to an earlier one's.

jsonargparse replaces a dict-typed setting (``pipeline.grpo``, ``pipeline.sft``, ...) as a whole
when a later ``--config`` sets it, so ``--config base.yaml --config fast.yaml`` with only
``pipeline.grpo: {temperature: 0.9}`` in ``fast.yaml`` silently put every other GRPO setting of
``base.yaml`` back to its default. Here the later file's keys are merged into the earlier
mapping, recursively, as ``--pipeline.grpo.temperature 0.9`` on the command line already does. A
mapping that names another ``class_path`` replaces the earlier one (its ``init_args`` belong to
another class).
"""

from __future__ import annotations

from typing import Any

from jsonargparse import ActionConfigFile


def merged(old: Any, new: Any) -> Any:
    """``new`` laid over ``old``: mappings key by key (recursively), anything else replaced."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    if "class_path" in new and new.get("class_path") != old.get("class_path"):
        return new
    return {**old, **{k: merged(old[k], v) if k in old else v for k, v in new.items()}}


def merging_config_file(mapping_keys: tuple[str, ...]) -> type[ActionConfigFile]:
    """An ``ActionConfigFile`` whose files merge the dict-typed settings ``mapping_keys``."""

    class MergingConfigFile(ActionConfigFile):
        @staticmethod
        def apply_config(parser, cfg, dest, value) -> None:
            before = {key: cfg.get(key) for key in mapping_keys}
            ActionConfigFile.apply_config(parser, cfg, dest, value)
            for key, old in before.items():
                if isinstance(old, dict) and old:
                    cfg[key] = merged(old, cfg.get(key))

    return MergingConfigFile
