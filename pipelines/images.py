"""The pinned image matrix (images/versions.yaml), as the pipeline and the tests read it."""

from __future__ import annotations

import functools
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
