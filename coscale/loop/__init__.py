"""The state of the CoScale-RL loop and its rules: curriculum, pools, solution bank, Rollout N schedule, solution sources, spend, commit points."""
