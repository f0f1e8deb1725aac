"""Training: its config, schedules, optimizers, the step, the loop and hooks, auto batch size, evaluation
while training, the session."""
