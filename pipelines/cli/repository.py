"""`tritonship repo` and `tritonship lease`: inspect and maintain the S3 model repository."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from components.repository.maintenance_settings import LeaseReleaseSettings, RepoGcSettings
from pipelines.cli.common import (
    EndpointOption,
    ModelOption,
    RepositoryOption,
    app,
    friendly_errors,
    out,
    out_console_line,
    s3_settings,
    step_options,
)

repo_app = typer.Typer(no_args_is_help=True, help="Inspect and maintain the S3 model repository.")
app.add_typer(repo_app, name="repo")


def _repository(repository: str, endpoint: str | None) -> Any:
    from components.repository import ModelRepository

    repo = ModelRepository(repository, s3_settings(endpoint))
    repo.check_access()
    return repo


@repo_app.command("ls")
@friendly_errors
def repo_ls(repository: RepositoryOption, s3_endpoint: EndpointOption = None) -> None:
    """Models with their promoted version and their candidates."""
    from rich.table import Table

    repo = _repository(repository, s3_endpoint)
    table = Table("model", "promoted", "production versions", "candidates (staged)", "incomplete")
    for model in repo.models():
        config, _ = repo.desired_config(model)
        promoted = ",".join(map(str, config.version_policy.specific.versions)) if config else "-"
        table.add_row(
            model,
            promoted,
            ", ".join(map(str, repo.versions(model, staged=False))) or "-",
            ", ".join(map(str, repo.versions(model, staged=True))) or "-",
            ", ".join(f"{v}{' (staged)' if s else ''}" for v, s in repo.incomplete_versions(model)) or "-",
        )
    out.print(table)


@repo_app.command("verify")
@friendly_errors
def repo_verify(
    repository: RepositoryOption,
    model: Annotated[str | None, typer.Argument(help="one model (default: all)")] = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Re-check every file of every complete version against its manifest's SHA-256 and size."""
    repo = _repository(repository, s3_endpoint)
    problems, checked = [], 0
    for name in [model] if model else repo.models():
        for staged in (True, False):
            for version in repo.versions(name, staged):
                checked += 1
                problems += repo.verify(name, version, staged)
    for problem in problems:
        out_console_line(f"MISMATCH {problem}")
    out_console_line(f"verified {checked} versions: {len(problems)} problem(s)")
    if problems:
        raise typer.Exit(1)


@repo_app.command("gc")
@friendly_errors
@step_options(RepoGcSettings)
def repo_gc(repository: RepositoryOption, chosen: RepoGcSettings, s3_endpoint: EndpointOption = None) -> None:
    """Remove version folders that have no manifest (interrupted publishes); with --keep, old versions too."""
    dry_run = chosen.dry_run
    removed = _repository(repository, s3_endpoint).gc(chosen.grace, dry_run, keep=chosen.keep or None)
    for uri in removed:
        out_console_line(f"{'would remove' if dry_run else 'removed'} {uri}")
    out_console_line(f"{len(removed)} version folder(s) {'found' if dry_run else 'removed'}")


@repo_app.command("history")
@friendly_errors
def repo_history(model: str, repository: RepositoryOption, s3_endpoint: EndpointOption = None) -> None:
    """Every recorded event of a model, oldest first."""
    from rich.table import Table

    table = Table("time", "event", "version", "run", "details")
    for event in _repository(repository, s3_endpoint).history(model):
        details = {k: v for k, v in event.items() if k not in ("time", "event", "version", "run_id", "model")}
        table.add_row(
            event["time"],
            event["event"],
            str(event.get("version") or "-"),
            event.get("run_id", ""),
            json.dumps(details, sort_keys=True)[:120],
        )
    out.print(table)


lease_app = typer.Typer(no_args_is_help=True, help="The per-model release lease (one release of a model at a time).")
app.add_typer(lease_app, name="lease")


@lease_app.command("show")
@friendly_errors
def lease_show(model: ModelOption, repository: RepositoryOption, s3_endpoint: EndpointOption = None) -> None:
    """Who holds the model's release lease, since when, and until when."""
    import time
    from datetime import UTC, datetime

    from components.repository import parse_utc

    held = _repository(repository, s3_endpoint).lease(model)
    if held is None:
        out_console_line(f"nobody holds the release lease of {model}")
        return
    left = held["expires"] - time.time()
    expires = datetime.fromtimestamp(held["expires"], UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    age = (datetime.now(UTC) - parse_utc(held["acquired"])).total_seconds()
    state = (
        f"expires {expires} (in {left:.0f} s)" if left > 0 else f"expired {expires} (the next release takes it over)"
    )
    out_console_line(f"{model}: held by {held['owner']} for {age:.0f} s; {state}")


@lease_app.command("release")
@friendly_errors
@step_options(LeaseReleaseSettings)
def lease_release(
    model: ModelOption, repository: RepositoryOption, chosen: LeaseReleaseSettings, s3_endpoint: EndpointOption = None
) -> None:
    """Give back a release lease whose run died; recorded in the model's history."""
    import getpass

    held = _repository(repository, s3_endpoint).break_lease(
        model, chosen.force, by=f"lease release by {getpass.getuser()}"
    )
    out_console_line(
        f"released the lease {held['owner']} held on {model}" if held else f"nobody held the lease of {model}"
    )
