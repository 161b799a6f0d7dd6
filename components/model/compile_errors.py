"""The compile step's errors, apart from the targets that raise them (compile.py, aoti.py)."""

from __future__ import annotations

from components.errors import TritonshipError


class CompileError(TritonshipError):
    """The model could not be compiled for the requested target."""


class ParityError(CompileError):
    """The compiled model's outputs differ from the eager reference beyond the tolerances."""


def root_cause(exc: BaseException) -> str:
    """The operation's own message: the last line of a TorchScript error, whose first lines are only
    "The following operation failed in the TorchScript interpreter" and a traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    cause = lines[-1]
    for prefix in ("RuntimeError: ", "builtins.RuntimeError: "):
        cause = cause.removeprefix(prefix)
    return cause[:300]
