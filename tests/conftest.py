"""Shared fixtures: one real embedded stack (S3 + two production Tritons + a gate Triton) per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipelines.stack import EmbeddedStack


@pytest.fixture(scope="session")
def stack() -> Iterator[EmbeddedStack]:
    with EmbeddedStack(replicas=2, gate=True) as running:
        yield running


@pytest.fixture(autouse=True)
def nothing_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used a stack, whatever its outcome: every model it loaded is unloaded again
    (gate and production), no lease is left in S3."""
    if "stack" not in request.fixturenames:
        yield
        return
    from tests.release_helpers import finish_every_release, loaded_models

    running = request.getfixturevalue("stack")
    before = loaded_models(running)
    yield
    finish_every_release(running, before)


@pytest.fixture
def s3(stack: EmbeddedStack):
    return stack.s3.client()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run where CUDA exists (the lent GPU machine); each has a CPU sibling that runs everywhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
