"""The two exceptions a run ends with: the scripts print the message as one line and exit 1, no traceback."""


class UserError(Exception):
    """Bad input or flags: the message names the file, the line and what is wrong."""


class RunError(Exception):
    """The run cannot go on (repeated non-finite steps, out of memory): the message names the step, the
    tower or the last good checkpoint, and what to change."""
