"""``--config`` given more than once: a later file's mappings add to an earlier one's.

jsonargparse replaces a dict-typed setting as a whole when a later ``--config`` sets it. The
module settings of ``coscale run`` are groups of typed arguments, so a later file sets only the
keys it names; the dict-typed settings named to :func:`merging_config_file` (``coscale run``'s
``pipeline.trainer``) are merged here instead: with ``pipeline.trainer: {max_epochs: 2}`` in a
later file, the earlier file's other trainer keys stay, as ``--pipeline.trainer.max_epochs 2``
on the command line would leave them. A mapping that names another ``class_path`` replaces the
earlier one (its ``init_args`` belong to another class).
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
