"""What goes to and from disk: weight names, checkpoints in, the loader, the run directory, export, serving,
result files and plots."""
