"""The pinned image matrix (images/versions.yaml), as the pipeline and the tests read it, and the rule it keeps."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml

MATRIX = Path(__file__).resolve().parents[1] / "images" / "versions.yaml"


@functools.cache
def matrix() -> dict[str, Any]:
    return yaml.safe_load(MATRIX.read_text())


def image(step_kind: str) -> str:
    """The image a pipeline component runs in: compile, gate or tools."""
    return matrix()["images"][step_kind]


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
