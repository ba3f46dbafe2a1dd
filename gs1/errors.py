"""The one error type the CLI turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input from the user (spec, data files, CLI arguments, service, key).

    The CLI prints `gs1: error: <message>` on one line and exits 2, with no traceback.
    """
