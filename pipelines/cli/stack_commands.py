"""`tritonship stack`: the embedded S3 + Triton stack, started and stopped by hand."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from components.errors import TritonshipError
from pipelines.cli.common import (
    DEFAULT_STATE_DIR,
    app,
    console,
    friendly_errors,
    out,
)

stack_app = typer.Typer(no_args_is_help=True, help="Start and stop the embedded S3 + Triton stack by hand.")
app.add_typer(stack_app, name="stack")


# ------------------------------------------------------------------------------------------- stack
@stack_app.command("up")
@friendly_errors
def stack_up(
    replicas: Annotated[int, typer.Option(help="production Triton replicas")] = 2,
    gate: Annotated[bool, typer.Option(help="also start the gate server (mounts the staging prefix)")] = True,
    state_dir: Annotated[Path, typer.Option(help="where the stack keeps its state and logs")] = DEFAULT_STATE_DIR,
) -> None:
    """Start S3 and Triton servers in the background; `tritonship stack down` stops them."""
    from pipelines import stack_background

    with console.status("starting the embedded stack"):
        description = stack_background.stack_up(state_dir.resolve(), replicas, gate)
    s3 = description["s3"]
    out.print(f"S3 endpoint   {s3['endpoint_url']}  bucket {s3['bucket']}  (credentials in {state_dir / 'state.json'})")
    out.print(f"production    {description['production_repository']}")
    out.print(f"staging       {description['staging_repository']}")
    for name, server in description["servers"].items():
        out.print(f"triton {name:<7} http://{server['http']}  grpc {server['grpc']}  metrics {server['metrics']}")
    if description["replicas"]:
        out.print(f"replicas      {description['replicas']}  (host:http-port:metrics-port)", soft_wrap=True)
    out.print(f"perf_analyzer {description['perf_analyzer']}")
    out.print(f"logs          {state_dir / 'logs'}")
    where = "" if state_dir == DEFAULT_STATE_DIR else f" --state-dir {shlex.quote(str(state_dir))}"
    out.print(f'point the steps at it: eval "$(tritonship stack env{where})"', highlight=False, soft_wrap=True)


@stack_app.command("down")
@friendly_errors
def stack_down(state_dir: Annotated[Path, typer.Option()] = DEFAULT_STATE_DIR) -> None:
    """Stop every process of the stack that `stack up` started."""
    from pipelines import stack_background

    stopped = stack_background.stack_down(state_dir.resolve())
    out.print(f"stopped {len(stopped)} process groups")


@stack_app.command("env")
@friendly_errors
def stack_env(state_dir: Annotated[Path, typer.Option()] = DEFAULT_STATE_DIR) -> None:
    """Print `export` lines that point the AWS CLI, boto3 and tritonship at the running stack: its S3
    credentials, the admin key, the repository, the gate, the replicas with their metrics ports and the torch
    it serves. `eval "$(tritonship stack env)"`, and the steps need no address."""
    state = _read_state(state_dir)
    for key, value in state["env"].items():
        typer.echo(f"export {key}={shlex.quote(str(value))}")  # plain: no markup, no wrapping for eval


def _read_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "state.json"
    if not path.exists():
        raise TritonshipError(f"no stack is up (no {path}); run `tritonship stack up`.")
    return json.loads(path.read_text())
