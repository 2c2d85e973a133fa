"""The run loop: the Optuna objective, GPU slots for parallel trials, progress and stopping rules."""
