"""`tritonship`: every step is a subcommand, plus the embedded stack, the repository tools and the demo."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from components import log, settings
from components.errors import TritonshipError
from components.settings import DEFAULT_INSTANCE_COUNTS, GATE_PARAMETERS, RELAXED_STABILITY_PCT

if TYPE_CHECKING:
    from components.results import Result

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_enable=False)
stack_app = typer.Typer(no_args_is_help=True, help="Start and stop the embedded S3 + Triton stack by hand.")
app.add_typer(stack_app, name="stack")

console = Console(stderr=True)
out = Console()
F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound="Result")
DEFAULT_STATE_DIR = Path(".stack")


@app.callback()
def main(verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="-v info, -vv debug")] = 0) -> None:
    log.configure(verbose)


def friendly_errors(fn: F) -> F:
    """Report a TritonshipError as one plain sentence and a non-zero exit, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TritonshipError as exc:
            console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:  # a path argument that is missing, a directory, or not ours to read or write
            where = f" {exc.filename}" if exc.filename else ""
            console.print(
                f"[bold red]error:[/] cannot use{where}: {(exc.strerror or str(exc)).lower()}; check the path.",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------- stack
@stack_app.command("up")
@friendly_errors
def stack_up(
    replicas: Annotated[int, typer.Option(help="production Triton replicas")] = 2,
    gate: Annotated[bool, typer.Option(help="also start the gate server (mounts the staging prefix)")] = True,
    state_dir: Annotated[Path, typer.Option(help="where the stack keeps its state and logs")] = DEFAULT_STATE_DIR,
) -> None:
    """Start S3 and Triton servers in the background; `tritonship stack down` stops them."""
    from pipelines import stack

    with console.status("starting the embedded stack"):
        description = stack.stack_up(state_dir.resolve(), replicas, gate)
    s3 = description["s3"]
    out.print(f"S3 endpoint   {s3['endpoint_url']}  bucket {s3['bucket']}  (credentials in {state_dir / 'state.json'})")
    out.print(f"production    {description['production_repository']}")
    out.print(f"staging       {description['staging_repository']}")
    for name, server in description["servers"].items():
        out.print(f"triton {name:<7} http://{server['http']}  grpc {server['grpc']}  metrics {server['metrics']}")
    out.print(f"perf_analyzer {description['perf_analyzer']}")
    out.print(f"logs          {state_dir / 'logs'}")


@stack_app.command("down")
@friendly_errors
def stack_down(state_dir: Annotated[Path, typer.Option()] = DEFAULT_STATE_DIR) -> None:
    """Stop every process of the stack that `stack up` started."""
    from pipelines import stack

    stopped = stack.stack_down(state_dir.resolve())
    out.print(f"stopped {len(stopped)} process groups")


@stack_app.command("env")
@friendly_errors
def stack_env(state_dir: Annotated[Path, typer.Option()] = DEFAULT_STATE_DIR) -> None:
    """Print `export` lines that point the AWS CLI, boto3 and tritonship at the running stack."""
    state = _read_state(state_dir)
    for key, value in state["env"].items():
        out.print(f"export {key}={value}", highlight=False)


def _read_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / "state.json"
    if not path.exists():
        raise TritonshipError(f"no stack is up (no {path}); run `tritonship stack up`.")
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------ export / compile
@app.command("export")
@friendly_errors
def export_cmd(
    model: Annotated[str, typer.Option(help="package.module:factory, a TorchScript file or an ExportedProgram .pt2")],
    signature: Annotated[Path, typer.Option(help="the I/O signature (YAML or JSON)")],
    out: Annotated[Path, typer.Option(help="output folder (must not exist)")],
    checkpoint: Annotated[str | None, typer.Option(help="state_dict for the factory's model: a path or s3://")] = None,
    golden: Annotated[Path | None, typer.Option(help=".npz of golden inputs keyed by input name")] = None,
    samples: Annotated[int, typer.Option(help="golden samples to generate when --golden is not given")] = 16,
    method: Annotated[settings.ExportMethod, typer.Option(help="auto: torch.export, then TorchScript")] = "auto",
) -> None:
    """Load a model, check it against its signature, export it with golden samples."""
    from components.export import export

    result = export(model, signature, out, checkpoint=checkpoint, golden=golden, samples=samples, method=method)
    out_console_line(f"exported with {result.method} to {result.out_dir / result.artifact}")
    if result.fallback_reason:
        out_console_line(f"  (fell back: {result.fallback_reason})")


@app.command("compile")
@friendly_errors
def compile_cmd(
    export_dir: Annotated[Path, typer.Argument(help="the output folder of `tritonship export`")],
    name: Annotated[str, typer.Option(help="the Triton model name")],
    out: Annotated[Path, typer.Option(help="output model folder (must not exist)")],
    target: Annotated[settings.Target, typer.Option(help="what to compile to")] = "torchscript",
    precision: Annotated[settings.Precision, typer.Option(help="bf16 with tensorrt only")] = "fp32",
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
    atol: Annotated[float | None, typer.Option(help="absolute tolerance (default by precision)")] = None,
    rtol: Annotated[float | None, typer.Option(help="relative tolerance (default by precision)")] = None,
    int_mismatch: Annotated[float | None, typer.Option(help="share of integer output elements that may differ")] = None,
    opt_batch: Annotated[int, typer.Option(help="TensorRT optimisation batch size")] = 8,
    workspace_gb: Annotated[float, typer.Option(help="TensorRT workspace in GiB")] = 2.0,
) -> None:
    """Compile an export for Triton, check parity against the eager model, write the model folder."""
    from components.compile import Tolerance, compile_model, parity_table

    tolerance = Tolerance.for_precision(precision, atol, rtol, int_mismatch)
    with console.status(f"compiling for {target} ({precision}, {device})"):
        result = compile_model(
            export_dir,
            out,
            name,
            target,
            precision,
            device,
            tolerance=tolerance,
            opt_batch=opt_batch,
            workspace_gb=workspace_gb,
        )
    out_console_line(parity_table(result.parity))
    out_console_line(f"compiled {target}/{precision} on {result.device} in {result.seconds:.1f} s -> {result.out_dir}")


def out_console_line(text: str) -> None:
    out.print(text, highlight=False, markup=False)


def read_text(path: Path, what: str) -> str:
    """A file argument's text, or one sentence saying why it cannot be read."""
    if path.is_dir():
        raise TritonshipError(f"the {what} {path} is a directory; give the file inside it.")
    try:
        return path.read_text()
    except FileNotFoundError:
        raise TritonshipError(f"the {what} {path} does not exist; check the path.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TritonshipError(f"the {what} {path} cannot be read ({exc.__class__.__name__}); check the file.") from None


def read_result(path: Path, what: str, kind: type[R]) -> R:
    """A step's result file (stage result, tuning result, verdict) as its type, or one sentence saying why not."""
    try:
        return kind.from_json(read_text(path, what))
    except ValueError as exc:
        raise TritonshipError(
            f"{path} is not a {what} written by tritonship ({exc}); pass the file the step wrote."
        ) from None


def _gate_settings(flat: dict[str, Any]) -> settings.GateSettings:
    """GateSettings from the CLI's flat options, with a plain error for values it refuses."""
    try:
        return settings.GateSettings.from_flat(**flat)
    except ValueError as exc:
        raise TritonshipError(f"{exc}.") from None


# ------------------------------------------------------------------------------- publish / repository
RepositoryOption = Annotated[
    str, typer.Option("--repository", "-r", envvar="TRITONSHIP_REPOSITORY", help="repository root, s3://bucket/prefix")
]
EndpointOption = Annotated[
    str | None, typer.Option("--s3-endpoint", envvar="AWS_ENDPOINT_URL_S3", help="S3 endpoint URL (not AWS)")
]


def s3_settings(endpoint: str | None) -> Any:
    from components.s3repo import S3Settings

    return S3Settings.from_env(endpoint)


@app.command("publish")
@friendly_errors
def publish_cmd(
    folder: Annotated[Path, typer.Argument(help="the output folder of `tritonship compile` or `ensemble` (a bundle)")],
    repository: RepositoryOption,
    run_id: Annotated[
        str | None, typer.Option(help="source run id (default: KFP_RUN_ID, else from the content)")
    ] = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Publish a compiled model folder (or an ensemble bundle) as a new immutable candidate version (staging)."""
    from components.publish import publish

    with console.status("publishing"):
        result = publish(folder, repository, run_id=run_id, s3=s3_settings(s3_endpoint))
    verb = "already published as" if result.resumed else "published"
    out_console_line(f"{verb} {result.model} version {result.version} -> {result.uri}")


@app.command("ensemble")
@friendly_errors
def ensemble_cmd(
    compiled: Annotated[Path, typer.Argument(help="the output folder of `tritonship compile`")],
    name: Annotated[str, typer.Option(help="the ensemble's name (what clients call)")],
    signature: Annotated[Path, typer.Option(help="the ensemble's I/O signature (YAML/JSON)")],
    model: Annotated[str, typer.Option(help="the eager model for the reference: pkg.mod:factory or a file")],
    pre: Annotated[Path, typer.Option(help="preprocessing: a folder with step.py and the files it reads")],
    pre_signature: Annotated[Path, typer.Option(help="preprocessing I/O signature")],
    post: Annotated[Path, typer.Option(help="postprocessing: a folder with step.py and the files it reads")],
    post_signature: Annotated[Path, typer.Option(help="postprocessing I/O signature")],
    inputs: Annotated[Path, typer.Option(help="golden ensemble inputs: .npz with one array per input")],
    out: Annotated[Path, typer.Option(help="the bundle folder to write")],
    checkpoint: Annotated[str | None, typer.Option(help="state_dict for the factory (local or s3://)")] = None,
) -> None:
    """Assemble a release bundle: the compiled model, its pre/post-processing steps and the ensemble that
    chains them, with reference outputs computed in Python from the same step.py code and the eager model."""
    import numpy as np

    from components.ensemble import Step, assemble
    from components.model_source import load_model
    from components.signature import Signature

    with np.load(inputs, allow_pickle=False) as data:
        golden = {k: data[k] for k in data.files}
    pre_name, post_name = f"{name}_pre", f"{name}_post"
    with console.status("running the reference and writing the bundle"):
        assemble(
            out,
            name,
            Signature.load(signature),
            compiled,
            Step(pre_name, pre, Signature.load(pre_signature)),
            Step(post_name, post, Signature.load(post_signature)),
            load_model(model, checkpoint),
            golden,
        )
    out_console_line(f"wrote the {name} bundle ({pre_name} -> {compiled.name} -> {post_name}) to {out}")


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
def repo_gc(
    repository: RepositoryOption,
    grace: Annotated[
        float, typer.Option(help="seconds an incomplete version is left alone (a publish may be running)")
    ] = 3600,
    dry_run: Annotated[bool, typer.Option(help="only list what would be removed")] = False,
    keep: Annotated[
        int | None, typer.Option(help="also retire sealed versions beyond the newest KEEP (never a served one)")
    ] = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Remove version folders that have no manifest (interrupted publishes); with --keep, old versions too."""
    removed = _repository(repository, s3_endpoint).gc(grace, dry_run, keep=keep)
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


# ------------------------------------------------------------------------------ stage / gate / promote
GateOption = Annotated[
    str, typer.Option("--gate", envvar="TRITONSHIP_GATE", help="gate server: host:port or k8s://ns/selector")
]
ModelOption = Annotated[str, typer.Option("--model", "-m", help="model name")]
VersionOption = Annotated[int, typer.Option("--version", help="candidate version")]
UnloadGateOption = Annotated[
    str | None, typer.Option("--gate", envvar="TRITONSHIP_GATE", help="the gate server, to unload the candidate from")
]


@contextlib.contextmanager
def lease_given_back_on_failure(
    repository: str, model: str, version: int, endpoint: str | None
) -> Iterator[list[bool]]:
    """A stage or gate run by hand that fails gives its release lease back (a pipeline run's exit handler does
    this for runs): the next release need not wait an hour for it. The body appends True when it succeeded."""
    succeeded: list[bool] = []
    try:
        yield succeeded
    finally:
        if not succeeded:
            from components.repository import ModelRepository, lease_owner

            try:
                ModelRepository(repository, s3_settings(endpoint)).release_lease(model, lease_owner("", model, version))
            except TritonshipError as exc:  # the failure itself is what the user must see; the lease expires
                log.event(log.get("cli"), "lease not given back", model=model, reason=str(exc), level=30)


def _one_server(spec: str) -> str:
    return _gate_server(spec, None)[0]


def _gate_server(spec: str, metrics: str | None) -> tuple[str, str]:
    """The server's HTTP host:port and its metrics endpoint (given, or found with a k8s:// pod; else none)."""
    from components.replicas import resolve

    server = resolve(spec)[0]
    return server.url, metrics or server.metrics_url


GateMetricsOption = Annotated[
    str | None,
    typer.Option(envvar="TRITONSHIP_GATE_METRICS", help="the gate's metrics endpoint host:port (GPU/CPU figures)"),
]


@app.command("stage")
@friendly_errors
def stage_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    result: Annotated[Path | None, typer.Option(help="write the stage result (JSON) here")] = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Load the candidate dark on the gate server and check its answers against the golden outputs."""
    from components.parity import parity_table
    from components.stage import stage

    with lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded:
        with console.status(f"loading {model} v{version} on the gate"):
            staged = stage(repository, model, version, _one_server(gate), s3=s3_settings(s3_endpoint))
        if staged.load_error:
            raise TritonshipError(f"the gate server could not load the candidate: {staged.load_error}")
        out_console_line(parity_table(staged.accuracy))
        if result:
            result.write_text(staged.to_json())
        out_console_line(
            f"staged {staged.candidate} v{version} on {staged.gate_url}: "
            f"accuracy {'ok' if staged.accuracy_passed else 'FAILED'}"
        )
        if not staged.accuracy_passed:
            raise typer.Exit(1)
        succeeded.append(True)


TuningOption = Annotated[Path | None, typer.Option(help="tuning.json written by `tritonship tune`")]


def _counts(text: str, option: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise typer.BadParameter(
            f"give whole numbers of 1 or more, comma-separated (like 1,2,4), not {text!r}", param_hint=option
        )
    return counts


@app.command("tune")
@friendly_errors
def tune_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out_file: Annotated[Path, typer.Option("--out", help="write the tuning result (JSON) here")],
    concurrency: Annotated[
        int, typer.Option(help="perf_analyzer concurrency (use the gate's)")
    ] = settings.DEFAULT_CONCURRENCY,
    window_ms: Annotated[int, typer.Option(help="perf_analyzer measurement window")] = 1000,
    stability_pct: Annotated[
        float, typer.Option(help="perf_analyzer stability threshold, %; the default takes any three windows")
    ] = RELAXED_STABILITY_PCT,
    max_p99_ms: Annotated[
        float | None, typer.Option(help="p99 limit; default: the default settings' p99 + slack")
    ] = None,
    p99_slack_pct: Annotated[float, typer.Option(help="how much p99 may grow over the default's")] = 10.0,
    budget: Annotated[int, typer.Option(help="settings measured at most")] = 16,
    min_gain_pct: Annotated[float, typer.Option(help="smallest throughput gain that moves the search")] = 5.0,
    instance_counts: Annotated[
        str,
        typer.Option(help="instance counts tried, comma-separated, for the model and for an ensemble's pre/post steps"),
    ] = ",".join(map(str, DEFAULT_INSTANCE_COUNTS)),
    intra_op_threads: Annotated[
        str,
        typer.Option(help="the PyTorch backend's intra-op thread counts tried, comma-separated (CPU models)"),
    ] = ",".join(map(str, settings.DEFAULT_INTRA_OP_THREAD_COUNTS)),
    gate_metrics: GateMetricsOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Search the candidate's serving settings on the gate server (config override; S3 untouched)."""
    from rich.table import Table

    from components import report
    from components.perf import LoadSettings
    from components.tune import TuneSettings, tune

    tune_settings = TuneSettings(
        load=LoadSettings(concurrency=concurrency, window_ms=window_ms, stability_pct=stability_pct),
        max_p99_ms=max_p99_ms,
        p99_slack_pct=p99_slack_pct,
        budget=budget,
        min_gain_pct=min_gain_pct,
        instance_counts=_counts(instance_counts, "--instance-counts"),
        intra_op_thread_counts=_counts(intra_op_threads, "--intra-op-threads"),
    )
    with console.status(f"tuning {model} v{version} on the gate (at most {budget} settings)"):
        url, metrics_url = _gate_server(gate, gate_metrics)
        result = tune(
            repository, model, version, url, tune_settings, s3=s3_settings(s3_endpoint), metrics_url=metrics_url
        )
    out_file.write_text(result.to_json())
    table = Table(*report.TUNING_HEADER)
    for row in report.tuning_rows(json.loads(result.to_json())):
        table.add_row(*row)
    out.print(table)
    out_console_line(f"chosen: {result.chosen} ({result.settings_measured} of {result.grid_size} settings measured)")
    if result.confirmation:
        out_console_line(f"the search's winner, {result.confirmation}")


def _gate_option(name: str) -> Any:
    """A `gate` option named, defaulted and explained by components/settings.py's GATE_PARAMETERS."""
    return typer.Option(help=GATE_PARAMETERS[name].help)


@app.command("gate")
@friendly_errors
def gate_cmd(
    repository: RepositoryOption,
    model: ModelOption,
    version: VersionOption,
    gate: GateOption,
    out: Annotated[Path, typer.Option(help="folder for verdict.json, report.md/html, the plot and raw CSVs")],
    stage_result: Annotated[Path | None, typer.Option(help="the stage result JSON (its accuracy check counts)")] = None,
    concurrency: Annotated[int, _gate_option("concurrency")] = settings.DEFAULT_CONCURRENCY,
    request_rate: Annotated[float, _gate_option("request_rate")] = 0.0,
    window_ms: Annotated[int, _gate_option("window_ms")] = settings.DEFAULT_WINDOW_MS,
    design: Annotated[settings.Design, _gate_option("design")] = settings.DEFAULT_DESIGN,
    min_rounds: Annotated[int, _gate_option("min_rounds")] = settings.DEFAULT_MIN_ROUNDS,
    budget_s: Annotated[float, _gate_option("budget_s")] = settings.DEFAULT_BUDGET_S,
    max_p99_ms: Annotated[float, _gate_option("max_p99_ms")] = 0.0,
    min_throughput: Annotated[float, _gate_option("min_throughput")] = 0.0,
    max_p99_regression_pct: Annotated[
        float, _gate_option("max_p99_regression_pct")
    ] = settings.DEFAULT_MAX_REGRESSION_PCT,
    max_throughput_regression_pct: Annotated[
        float, _gate_option("max_throughput_regression_pct")
    ] = settings.DEFAULT_MAX_REGRESSION_PCT,
    tuning: TuningOption = None,
    gate_metrics: GateMetricsOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Measure candidate against stable with perf_analyzer and decide pass / fail / inconclusive. Exit 0 only on pass."""
    from components import gate as gate_step
    from components.results import StageResult, TuneResult

    given = locals()
    gate_settings = _gate_settings({name: given[name] for name in GATE_PARAMETERS})
    staged = read_result(stage_result, "stage result", StageResult) if stage_result else None
    tuned = read_result(tuning, "tuning result", TuneResult) if tuning else None
    with lease_given_back_on_failure(repository, model, version, s3_endpoint) as succeeded:
        with console.status(f"measuring {model} v{version} against stable (at most {budget_s:g} s)"):
            url, metrics_url = _gate_server(gate, gate_metrics)
            result = gate_step.gate(
                repository,
                model,
                version,
                url,
                gate_settings,
                staged,
                out,
                s3=s3_settings(s3_endpoint),
                tuning=tuned,
                metrics_url=metrics_url,
            )
        if (out / "report.md").exists():
            out_console_line((out / "report.md").read_text())
        out_console_line(f"verdict: {result.verdict}")
        if result.verdict != "pass":
            raise typer.Exit(1)
        succeeded.append(True)


@app.command("promote")
@friendly_errors
def promote_cmd(
    repository: RepositoryOption,
    verdict: Annotated[Path, typer.Option(help="verdict.json written by `tritonship gate`; must say pass")],
    replicas: Annotated[str, typer.Option(help="production replicas: host:port,... or k8s://ns/selector")],
    gate: UnloadGateOption = None,
    tuning: TuningOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Roll the gated candidate out to every production replica, one at a time; revert on any failure."""
    from components.promote import promote
    from components.replicas import resolve
    from components.results import TuneResult, Verdict

    decided = read_result(verdict, "verdict", Verdict)
    targets = resolve(replicas)
    serving = read_result(tuning, "tuning result", TuneResult).chosen if tuning else None
    with console.status(f"promoting {decided.model} v{decided.version} to {len(targets)} replicas") as status:
        result = promote(
            repository,
            decided.model,
            decided.version,
            targets,
            decided.verdict,
            gate_url=_one_server(gate) if gate else None,
            settings=serving,
            s3=s3_settings(s3_endpoint),
            progress=lambda what, replica: status.update(f"{what} {replica.name}"),
        )
    out_console_line(
        f"promoted {result.model} v{result.version} (was {result.previous_version}) on {len(result.replicas)} replicas"
    )


@app.command("reject")
@friendly_errors
def reject_cmd(
    repository: RepositoryOption,
    verdict: Annotated[Path, typer.Option(help="verdict.json written by `tritonship gate`")],
    gate: UnloadGateOption = None,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Unload the candidate from the gate, leave production untouched, record the verdict."""
    from components.promote import reject
    from components.results import Verdict

    decided = read_result(verdict, "verdict", Verdict)
    reject(
        repository,
        decided.model,
        decided.version,
        decided.verdict,
        decided.reasons,
        gate_url=_one_server(gate) if gate else None,
        s3=s3_settings(s3_endpoint),
    )
    out_console_line(f"rejected {decided.model} v{decided.version} ({decided.verdict}); production unchanged")


@app.command("reconcile")
@friendly_errors
def reconcile_cmd(
    repository: RepositoryOption,
    replicas: Annotated[str, typer.Option(help="production replicas: host:port,... or k8s://ns/selector")],
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="only these models (repeat)")] = None,
    dry_run: Annotated[bool, typer.Option(help="only report what differs")] = False,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Make every production replica serve the desired state in S3; exit 1 if any replica does not."""
    from rich.table import Table

    from components.reconcile import reconcile
    from components.replicas import resolve
    from components.triton_admin import TritonAdmin

    targets = resolve(replicas)
    if not any(TritonAdmin(r.url, timeout=10, retries=1).is_live() for r in targets):
        raise TritonshipError(
            f"no replica answered ({', '.join(r.url for r in targets)}); check the addresses and that Triton runs there."
        )
    states = reconcile(repository, targets, model or None, dry_run, s3_settings(s3_endpoint))
    table = Table("replica", "model", "desired", "was serving", "action")
    for s in states:
        table.add_row(s.replica, s.model, ",".join(map(str, s.desired)), ",".join(map(str, s.serving)) or "-", s.action)
    out.print(table)
    if not all(s.ok for s in states):
        raise typer.Exit(1)


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
def lease_release(
    model: ModelOption,
    repository: RepositoryOption,
    force: Annotated[
        bool, typer.Option(help="also while the lease has not expired (its run may still be alive)")
    ] = False,
    s3_endpoint: EndpointOption = None,
) -> None:
    """Give back a release lease whose run died; recorded in the model's history."""
    import getpass

    held = _repository(repository, s3_endpoint).break_lease(model, force, by=f"lease release by {getpass.getuser()}")
    out_console_line(
        f"released the lease {held['owner']} held on {model}" if held else f"nobody held the lease of {model}"
    )


# ---------------------------------------------------------------------------------- pipeline / runs
pipeline_app = typer.Typer(no_args_is_help=True, help="The KFP pipeline definition.")
app.add_typer(pipeline_app, name="pipeline")
ParamOption = Annotated[list[str] | None, typer.Option("--param", "-p", help="pipeline parameter name=value (repeat)")]


@pipeline_app.command("compile")
@friendly_errors
def pipeline_compile(
    out_path: Annotated[Path | None, typer.Option("--out", help="default: pipelines/release_pipeline.yaml")] = None,
) -> None:
    """Compile the release pipeline to KFP IR YAML."""
    from pipelines.kubeflow import COMPILED, compile_pipeline

    if out_path is not None and (out_path.is_dir() or out_path.suffix not in (".yaml", ".yml")):
        raise TritonshipError(f"--out {out_path} must name a .yaml file, not a folder or another kind of file.")
    out_console_line(f"wrote {compile_pipeline(out_path or COMPILED)}")


@app.command("run")
@friendly_errors
def run_cmd(
    local: Annotated[bool, typer.Option("--local", help="run under KFP's local runner (the only mode here)")] = False,
    stack: Annotated[bool, typer.Option(help="start the embedded stack and point the run at it")] = True,
    param: ParamOption = None,
    pipeline_root: Annotated[Path, typer.Option(help="where the local runner keeps task outputs")] = Path(
        "local_outputs"
    ),
) -> None:
    """Run the release pipeline locally: against the embedded stack, or (--no-stack) given endpoints."""
    from pipelines.demo import demo_parameters
    from pipelines.kubeflow import parse_parameters
    from pipelines.local import run_local

    if not local:
        raise TritonshipError("only --local runs here; use `tritonship submit` to run on Kubeflow.")
    overrides = parse_parameters(param or [])
    if not stack:
        with console.status("running the pipeline locally"):
            run = run_local(overrides, pipeline_root.resolve())
    else:
        from pipelines.stack import EmbeddedStack

        with console.status("starting the embedded stack"), EmbeddedStack(replicas=2, gate=True) as embedded:
            parameters = demo_parameters(embedded, "pipelines.samples.bert4rec:bert4rec_v1") | overrides
            run = run_local(parameters, pipeline_root.resolve(), env=embedded.env())
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
    service_account: Annotated[str, typer.Option(help="from manifests/rbac/")] = "tritonship-pipeline",
) -> None:
    """Create a run of the release pipeline on a Kubeflow Pipelines endpoint."""
    from pipelines.kubeflow import parse_parameters, submit

    run_id = submit(host, parse_parameters(param or []), run_name, experiment, service_account)
    out_console_line(f"created run {run_id}")


@app.command("schedule")
@friendly_errors
def schedule_cmd(
    host: Annotated[str, typer.Option(envvar="KFP_HOST", help="KFP API endpoint")],
    cron: Annotated[str, typer.Option(help="6 fields, seconds first: '0 0 3 * * *' is 03:00 daily")],
    name: Annotated[str, typer.Option()] = "tritonship-scheduled-release",
    param: ParamOption = None,
    experiment: Annotated[str, typer.Option()] = "tritonship",
    service_account: Annotated[str, typer.Option(help="from manifests/rbac/")] = "tritonship-pipeline",
) -> None:
    """Create a recurring run (scheduled retraining releases); at most one run at a time, no catch-up."""
    from pipelines.kubeflow import parse_parameters, schedule

    job_id = schedule(host, parse_parameters(param or []), name, cron, experiment, service_account)
    out_console_line(f"created recurring run {job_id} ({cron})")


# -------------------------------------------------------------------------------------------- demo
@app.command("demo")
@friendly_errors
def demo(workdir: Annotated[Path | None, typer.Option(help="keep the pipeline runs' outputs here")] = None) -> None:
    """Three releases of the BERT4Rec recommender through the whole pipeline on the embedded stack."""
    from pipelines.demo import run_demo

    if workdir is not None and workdir.exists() and not workdir.is_dir():
        raise TritonshipError(f"the work folder {workdir} is a file; give a folder (or a path that does not exist).")
    sys.exit(run_demo(out, workdir))


if __name__ == "__main__":
    app()
