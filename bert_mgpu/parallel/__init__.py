"""Devices and strategy: which machines, the device plan, precision, tf.distribute in one place, what stops a run."""
