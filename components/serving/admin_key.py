"""The admin key: production and gate Tritons answer their model-repository and model-config APIs (load,
unload, repository index, model config) only to requests that carry it in a header. Inference, health and
metadata stay open (docs/design.md section 6).

tritonship reads the key from TRITONSHIP_ADMIN_KEY, else from the file TRITONSHIP_ADMIN_KEY_FILE (a mounted
Kubernetes Secret). The key is only ever put in a request header or a server argument: never logged,
never in a report, an exception or the compiled pipeline."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from components.errors import TritonshipError

HEADER = "tritonship-admin-key"
ENV = "TRITONSHIP_ADMIN_KEY"
FILE_ENV = "TRITONSHIP_ADMIN_KEY_FILE"
RESTRICTED_APIS = ("model-repository", "model-config")


def from_env() -> str | None:
    """The admin key this process was given, or None (a Triton whose admin API is open needs none)."""
    if os.environ.get(ENV):
        return os.environ[ENV].strip()
    path = os.environ.get(FILE_ENV)
    if not path:
        return None
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise TritonshipError(
            f"the admin key file {path} (from {FILE_ENV}) cannot be read ({exc.strerror or exc}); "
            "mount the Secret there or unset the variable."
        ) from None
    if not key:
        raise TritonshipError(f"the admin key file {path} (from {FILE_ENV}) is empty; it must hold the key.")
    return key


def triton_args(key: str, locked: Sequence[str] = RESTRICTED_APIS) -> list[str]:
    """tritonserver arguments that lock the admin APIs (the `locked` groups) on HTTP and gRPC behind `key`."""
    apis = ",".join(locked)
    return [f"--http-restricted-api={apis}:{HEADER}={key}", f"--grpc-restricted-protocol={apis}:{HEADER}={key}"]
