"""The release lease for CLI users: see who holds it, give back a dead run's, and a failed stage or gate run
by hand gives its own back."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from components.release.publish import publish
from components.release.run_context import RunContext
from components.repository import ModelRepository, lease_owner
from pipelines.cli import app
from tests.models import mlp_folder
from tests.release_helpers import repository, unique


def _cli(stack, *args: str):
    return CliRunner().invoke(app, list(args), env={**stack.s3.env(), "COLUMNS": "200"})


def test_lease_show_and_release_refuses_a_live_holder_without_force(tmp_path, stack):
    name = unique("lease")
    repo = ModelRepository(repository(stack), stack.s3)
    assert "nobody holds" in _cli(stack, "lease", "show", "-m", name, "-r", repository(stack)).output
    repo.acquire_lease(name, "run-that-died", seconds=600)

    shown = _cli(stack, "lease", "show", "-m", name, "-r", repository(stack))
    assert shown.exit_code == 0
    assert re.search(rf"{name}: held by run-that-died for \d+ s; expires \S+ \(in (59\d|600) s\)", shown.output)

    refused = _cli(stack, "lease", "release", "-m", name, "-r", repository(stack))
    assert refused.exit_code == 3 and "may still be alive" in refused.output and "--force" in refused.output
    assert repo.lease(name)["owner"] == "run-that-died"  # refused: nothing changed

    forced = _cli(stack, "lease", "release", "-m", name, "-r", repository(stack), "--force")
    assert forced.exit_code == 0 and "released the lease run-that-died held" in forced.output
    assert repo.lease(name) is None
    event = repo.history(name)[-1]
    assert (event["event"], event["owner"], event["forced"]) == ("lease released", "run-that-died", True)


def test_an_expired_lease_is_released_without_force(stack):
    name = unique("lease")
    repo = ModelRepository(repository(stack), stack.s3)
    repo.acquire_lease(name, "old-run", seconds=-1)
    assert "expired" in _cli(stack, "lease", "show", "-m", name, "-r", repository(stack)).output
    assert _cli(stack, "lease", "release", "-m", name, "-r", repository(stack)).exit_code == 0
    assert repo.lease(name) is None and repo.history(name)[-1]["forced"] is False


def test_a_failed_cli_stage_gives_its_lease_back(tmp_path, stack):
    """The candidate answers wrongly: stage exits 1, and the next release need not wait for the lease."""
    name = unique("lease")
    repo = ModelRepository(repository(stack), stack.s3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    publish(
        RunContext(repository(stack), "", s3=stack.s3), folder=mlp_folder(tmp_path / "a", name, seed=1, weights_seed=2)
    )
    staged = _cli(stack, "stage", "-r", repository(stack), "-m", name, "--version", "1", "--gate", stack.gate.http_url)
    assert staged.exit_code == 1 and "FAILED" in staged.output
    assert repo.lease(name) is None
    # the same run, passing: the lease stays with the release until promote or reject
    publish(RunContext(repository(stack), "", s3=stack.s3), folder=mlp_folder(tmp_path / "b", name, seed=3))
    staged = _cli(stack, "stage", "-r", repository(stack), "-m", name, "--version", "2", "--gate", stack.gate.http_url)
    assert staged.exit_code == 0, staged.output
    assert repo.lease(name)["owner"] == lease_owner("", name, 2)
