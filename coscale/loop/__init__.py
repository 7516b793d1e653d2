"""The state of the CoScale-RL loop and its rules: the ``Problem`` record, curriculum, pools,
solution bank, mastered set, Rollout N schedule, solution sources, spend, commit points."""
