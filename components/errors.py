"""The one exception type a user sees: a plain sentence saying what is wrong and what to do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

REFUSAL_PREFIX = "error: "  # how a refused task's last line starts (pipelines/local.py reads it back)


class TritonshipError(Exception):
    """A failure caused by input or environment, reported to the user without a traceback.

    The CLI prints the message and exits non-zero; code that raises it must leave nothing
    half-written behind.
    """

    exit_code = 2


@contextlib.contextmanager
def refused_in_one_sentence() -> Iterator[None]:
    """For a pipeline task's body: a TritonshipError ends the process with `error: <sentence>` and exit 1, where
    KFP's executor would print a traceback around it."""
    try:
        yield
    except TritonshipError as exc:
        raise SystemExit(f"{REFUSAL_PREFIX}{exc}") from None
