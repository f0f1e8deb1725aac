"""The bottom layer: errors, TensorFlow internals read without a public name (_compat), storage, quiet
start-up, the supervising parent process, metrics."""
