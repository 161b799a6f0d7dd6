"""The one exception type a user sees: a plain sentence saying what is wrong and what to do."""


class TritonshipError(Exception):
    """A failure caused by input or environment, reported to the user without a traceback.

    The CLI prints the message and exits non-zero; code that raises it must leave nothing
    half-written behind.
    """

    exit_code = 2
