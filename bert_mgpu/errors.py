"""The one exception type for user mistakes: the scripts print its message as one line and exit 1."""


class UserError(Exception):
    """Bad input or flags: the message names the file, the line and what is wrong; no traceback."""
