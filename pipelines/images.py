"""The pinned image matrix (images/versions.yaml), as the pipeline and the tests read it, and the rule it keeps."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

from components.errors import TritonshipError

MATRIX = Path(__file__).resolve().parents[1] / "images" / "versions.yaml"
# Where a user pushes the project's images (`images build --push`) and which registry the compiled pipeline names
# (`pipeline compile`, `submit`, `schedule`): the option --registry, else this variable, else versions.yaml's.
REGISTRY_ENV = "TRITONSHIP_REGISTRY"


@functools.cache
def matrix() -> dict[str, Any]:
    return yaml.safe_load(MATRIX.read_text())


def image(step_kind: str) -> str:
    """The image a pipeline component runs in: compile, gate or tools."""
    return matrix()["images"][step_kind]


def in_registry(name: str, registry: str | None) -> str:
    """`name` (a matrix image such as ghcr.io/tritonship/tools:0.1.0) in `registry` (host[:port][/path]): the
    repository's last part and the tag are kept. An empty registry keeps the name."""
    registry = (registry or "").strip().rstrip("/")
    if not registry:
        return name
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*(:\d+)?(/[a-z0-9._-]+)*", registry):
        raise TritonshipError(
            f"the registry {registry!r} is not host[:port][/path] in lower case; give one such as registry.example.com/ml."
        )
    return f"{registry}/{name.rsplit('/', 1)[-1]}"


def registry_images(registry: str | None) -> dict[str, str]:
    """The matrix's pipeline images (compile, gate, tools) as they are named in `registry`."""
    return {kind: in_registry(name, registry) for kind, name in matrix()["images"].items()}


def ngc_release_of(image: str) -> str:
    """The NGC release (YY.MM) of an nvcr.io `<YY.MM>-py3` image."""
    match = re.search(r":(\d{2}\.\d{2})-py3", image)
    if not match:
        raise ValueError(f"{image} is not an NGC <YY.MM>-py3 image")
    return match.group(1)


def check_one_ngc_release(versions: dict[str, Any]) -> None:
    """The compile, Triton server and gate bases of `versions` (the matrix) come from one NGC release: the TensorRT
    engine in a compiled model.pt loads only in the server of the release it was built in (images/versions.yaml)."""
    releases = {k: ngc_release_of(versions["base"][k]) for k in ("compile", "triton", "gate")}
    if len(set(releases.values())) != 1:
        raise ValueError(f"compile, Triton and gate images come from different NGC releases: {releases}")
