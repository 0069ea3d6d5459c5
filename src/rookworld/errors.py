"""Error types that the CLI reports as one line, without a traceback."""


class UserError(Exception):
    """Bad input from the user (a path, a flag, a file's content): the message names it and the fix."""


class InvalidPromptError(UserError, ValueError):
    """A prompt that is not a well-formed P or A prompt (bad FEN, bad UCI move, wrong layout)."""
