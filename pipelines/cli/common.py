"""`tritonship`: every step is a subcommand, plus the embedded stack, the repository tools and the demo.

This module holds what the command groups share: the app, the consoles, the error handling, the options
several groups take and the readers of files a step wrote."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperOption

from components import log
from components.errors import TritonshipError
from components.settings_model import SettingsError, StepSettings

if TYPE_CHECKING:
    from components.release.results import Result
    from components.serving.replicas import Replica

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__.split("\n")[0], pretty_exceptions_enable=False
)
_typed = TyperOption.display_type_rich
# Typer 0.29's help tags every option with its type, a flag too (`--containers <bool>`): a flag takes no value.
TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else _typed(self, ctx)  # type: ignore[method-assign]

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
            console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except OSError as exc:  # a path argument that is missing, a directory, or not ours to read or write
            where = f" {exc.filename}" if exc.filename else ""
            console.print(
                f"[bold red]error:[/] cannot use{escape(where)}: {escape((exc.strerror or str(exc)).lower())}; check the path.",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


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
    except UnicodeDecodeError:
        raise TritonshipError(f"the {what} {path} is not a text file; pass the JSON file the step wrote.") from None
    except OSError as exc:
        raise TritonshipError(f"the {what} {path} cannot be read ({exc.strerror or exc}); check the file.") from None


def read_result(path: Path, what: str, kind: type[R]) -> R:
    """A step's result file (stage result, tuning result, verdict) as its type, or one sentence saying why not."""
    try:
        return kind.from_json(read_text(path, what))
    except ValueError as exc:
        raise TritonshipError(
            f"{path} is not a {what} written by tritonship ({exc}); pass the file the step wrote."
        ) from None


def step_options(kind: type[StepSettings]) -> Callable[[F], F]:
    """A step command's settings options, made from its settings type (components/settings_model.py): the
    command's parameter annotated with `kind` becomes, in its place, one option per option of the type that the
    CLI takes, with its help, default, spellings and environment variable (`tritonship stack env` exports the
    embedded stack's); the command receives the settings built from them. A value they refuse is one sentence
    naming each refused option as the user typed it, and exit 2."""

    def made(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        [into] = [p.name for p in signature.parameters.values() if p.annotation is kind]
        options = [o for o in kind.options().values() if o.cli]
        generated = [
            inspect.Parameter(
                o.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=o.default,
                annotation=Annotated[o.kind, typer.Option(*o.flags, envvar=o.envvar, help=o.help)],
            )
            for o in options
        ]
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values()]
        twice = sorted({p.name for p in own} & {o.name for o in options})
        if twice:  # tests/test_settings.py: a step's options are declared by its settings type alone
            raise TypeError(f"{command.__name__} declares {', '.join(twice)}, an option of {kind.__name__}")
        at = [p.name for p in own].index(into)
        parameters = [*own[:at], *generated, *own[at + 1 :]]

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            flat = {o.name: given.pop(o.name) for o in options}
            try:
                chosen = kind.from_flat(**flat)
            except SettingsError as exc:
                raise TritonshipError(exc.said(lambda name: kind.options()[name].flag).rstrip(".") + ".") from None
            return command(**given, **{into: chosen})

        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
        return run  # type: ignore[return-value]

    return made


# ------------------------------------------------------------------------------- publish / repository
RepositoryOption = Annotated[
    str, typer.Option("--repository", "-r", envvar="TRITONSHIP_REPOSITORY", help="repository root, s3://bucket/prefix")
]
EndpointOption = Annotated[
    str | None, typer.Option("--s3-endpoint", envvar="AWS_ENDPOINT_URL_S3", help="S3 endpoint URL (not AWS)")
]


def s3_settings(endpoint: str | None) -> Any:
    from components.s3 import S3Settings

    return S3Settings.from_env(endpoint)


GateOption = Annotated[
    str, typer.Option("--gate", envvar="TRITONSHIP_GATE", help="gate server: host:port or k8s://ns/selector")
]
ModelOption = Annotated[str, typer.Option("--model", "-m", help="model name")]
VersionOption = Annotated[int, typer.Option("--version", help="candidate version")]
UnloadGateOption = Annotated[
    str | None, typer.Option("--gate", envvar="TRITONSHIP_GATE", help="the gate server, to unload the candidate from")
]


def gate_server(spec: str, metrics: str | None = None) -> Replica:
    """The gate server `--gate` names (of several, the first), as the pipeline's tasks see it, with its metrics
    endpoint: `metrics` where given, else the one `spec` or its k8s:// pod names."""
    from components.serving.replicas import resolve

    server = resolve(spec)[0]
    return dataclasses.replace(server, metrics_url=metrics or server.metrics_url)


GateMetricsOption = Annotated[
    str | None,
    typer.Option(envvar="TRITONSHIP_GATE_METRICS", help="the gate's metrics endpoint host:port (GPU/CPU figures)"),
]
