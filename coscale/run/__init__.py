"""The run's machinery beside `coscale.pipeline`: its settings checked once, the fit every stage
shares (context), commit checkpoints, precision chosen from the machine, the stage plan, epoch
counts and the console."""
