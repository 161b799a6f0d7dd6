"""Shared fixtures: one real embedded stack (S3 + two production Tritons + a gate Triton) per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipelines.stack import EmbeddedStack


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    with EmbeddedStack(replicas=2, gate=True) as running:
        yield running


@pytest.fixture
def s3(stack: EmbeddedStack):
    return stack.s3.client()
