"""The stages of a CoScale-RL run, one function each: SFT (the warm-up too), measurement, RL and the
final retrain."""
