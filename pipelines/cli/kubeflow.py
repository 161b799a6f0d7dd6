"""`tritonship pipeline|run|submit|schedule|demo`: the KFP pipeline, its runs and the demo."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from components.errors import TritonshipError
from pipelines.cli.common import (
    app,
    console,
    friendly_errors,
    out,
    out_console_line,
)
from pipelines.images import REGISTRY_ENV
from pipelines.kubeflow import DEFAULT_SERVICE_ACCOUNT, RELEASE_PIPELINE

# ---------------------------------------------------------------------------------- pipeline / runs
pipeline_app = typer.Typer(no_args_is_help=True, help="The KFP pipeline definition.")
app.add_typer(pipeline_app, name="pipeline")
ParamOption = Annotated[list[str] | None, typer.Option("--param", "-p", help="pipeline parameter name=value (repeat)")]
ContainersOption = Annotated[
    bool,
    typer.Option(
        "--containers",
        help="run every task in the project's images (KFP's DockerRunner; bash scripts/setup.sh --containers builds them)",
    ),
]
RegistryOption = Annotated[
    str | None,
    typer.Option(
        "--registry",
        envvar=REGISTRY_ENV,
        # \[ keeps rich from reading [/path] as a closing tag
        help="registry the pipeline's images are pulled from (host[:port]\\[/path]); default: images/versions.yaml's",
    ),
]
PipelineOption = Annotated[
    str,
    typer.Option(
        "--pipeline",
        help="the pipeline, package.module:function of a @dsl.pipeline, such as a training pipeline that ends in the "
        "release (pipelines.examples.train_and_release:train_and_release)",
    ),
]


@pipeline_app.command("compile")
@friendly_errors
def pipeline_compile(
    out_path: Annotated[
        Path | None,
        typer.Option("--out", help="default: pipelines/release_pipeline.yaml, or <function>.yaml for another pipeline"),
    ] = None,
    registry: RegistryOption = None,
    pipeline: PipelineOption = RELEASE_PIPELINE,
) -> None:
    """Compile the release pipeline (or --pipeline) to KFP IR YAML."""
    from pipelines.kubeflow import COMPILED, compile_pipeline

    if out_path is not None and (out_path.is_dir() or out_path.suffix not in (".yaml", ".yml")):
        raise TritonshipError(f"--out {out_path} must name a .yaml file, not a folder or another kind of file.")
    default = COMPILED if pipeline == RELEASE_PIPELINE else Path(f"{pipeline.rpartition(':')[2]}.yaml")
    out_console_line(f"wrote {compile_pipeline(out_path or default, registry, pipeline)}")


@app.command("run")
@friendly_errors
def run_cmd(
    local: Annotated[bool, typer.Option("--local", help="run under KFP's local runner (the only mode here)")] = False,
    stack: Annotated[bool, typer.Option(help="start the embedded stack and point the run at it")] = True,
    param: ParamOption = None,
    pipeline_root: Annotated[Path, typer.Option(help="where the local runner keeps task outputs")] = Path(
        "local_outputs"
    ),
    containers: ContainersOption = False,
) -> None:
    """Run the release pipeline locally: against the embedded stack, or (--no-stack) given endpoints."""
    from pipelines.demo import demo_parameters
    from pipelines.kubeflow import parse_parameters
    from pipelines.local import run_local

    if not local:
        raise TritonshipError("only --local runs here; use `tritonship submit` to run on Kubeflow.")
    overrides = parse_parameters(param or [])
    runner = "docker" if containers else "subprocess"
    if not stack:
        with console.status("running the pipeline locally"):
            run = run_local(overrides, pipeline_root.resolve(), runner=runner)
    else:
        from pipelines.stack import EmbeddedStack

        with console.status("starting the embedded stack"), EmbeddedStack(replicas=2, gate=True) as embedded:
            parameters = demo_parameters(embedded, "pipelines.samples.bert4rec:bert4rec_v1") | overrides
            run = run_local(parameters, pipeline_root.resolve(), env=embedded.env(), runner=runner)
    verdict = run.verdict or {}
    outcome = "promoted" if run.promoted else "rejected" if run.rejected else "stopped"
    out_console_line(
        f"version {run.version}: {verdict.get('verdict')} -> {outcome}; {'; '.join(verdict.get('reasons', []))}"
    )
    out_console_line(f"task outputs: {run.root}")


@app.command("submit")
@friendly_errors
def submit_cmd(
    host: Annotated[str, typer.Option(envvar="KFP_HOST", help="KFP API endpoint")],
    param: ParamOption = None,
    run_name: Annotated[str, typer.Option()] = "tritonship-release",
    experiment: Annotated[str, typer.Option()] = "tritonship",
    service_account: Annotated[str, typer.Option(help="from manifests/rbac/")] = DEFAULT_SERVICE_ACCOUNT,
    registry: RegistryOption = None,
    pipeline: PipelineOption = RELEASE_PIPELINE,
) -> None:
    """Create a run of the release pipeline (or --pipeline) on a Kubeflow Pipelines endpoint."""
    from pipelines.kubeflow import parse_parameters, submit

    parameters = parse_parameters(param or [], pipeline)
    run_id = submit(host, parameters, run_name, experiment, service_account, registry, pipeline)
    out_console_line(f"created run {run_id}")


@app.command("schedule")
@friendly_errors
def schedule_cmd(
    host: Annotated[str, typer.Option(envvar="KFP_HOST", help="KFP API endpoint")],
    cron: Annotated[str, typer.Option(help="6 fields, seconds first: '0 0 3 * * *' is 03:00 daily")],
    name: Annotated[str, typer.Option()] = "tritonship-scheduled-release",
    param: ParamOption = None,
    experiment: Annotated[str, typer.Option()] = "tritonship",
    service_account: Annotated[str, typer.Option(help="from manifests/rbac/")] = DEFAULT_SERVICE_ACCOUNT,
    registry: RegistryOption = None,
    pipeline: PipelineOption = RELEASE_PIPELINE,
) -> None:
    """Create a recurring run of the release pipeline (or --pipeline, a training pipeline that releases what it
    trains); at most one run at a time, no catch-up."""
    from pipelines.kubeflow import parse_parameters, schedule

    parameters = parse_parameters(param or [], pipeline)
    job_id = schedule(host, parameters, name, cron, experiment, service_account, registry, pipeline)
    out_console_line(f"created recurring run {job_id} ({cron})")


# -------------------------------------------------------------------------------------------- demo
@app.command("demo")
@friendly_errors
def demo(
    workdir: Annotated[Path | None, typer.Option(help="keep the pipeline runs' outputs here")] = None,
    containers: ContainersOption = False,
    param: ParamOption = None,
) -> None:
    """Five releases of the BERT4Rec recommender through the whole pipeline on the embedded stack."""
    from pipelines.demo import run_demo
    from pipelines.kubeflow import parse_parameters

    if workdir is not None and workdir.exists() and not workdir.is_dir():
        raise TritonshipError(f"the work folder {workdir} is a file; give a folder (or a path that does not exist).")
    runner = "docker" if containers else "subprocess"
    sys.exit(run_demo(out, workdir, runner=runner, overrides=parse_parameters(param or [])))
