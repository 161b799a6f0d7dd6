"""Running the release pipeline under KFP's local runner, and reading back what its tasks produced."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.errors import REFUSAL_PREFIX, TritonshipError

# Expected by design, once per task: our components name their images (images/versions.yaml), which the
# SubprocessRunner does not run, and the compile task asks for a GPU, which it ignores. Only these are silenced.
EXPECTED_WARNINGS = (
    (r"You may be attemping to run a task that uses custom or non-Python base image", RuntimeWarning),
    (r"Task 'compile-op': settings \['accelerator'\] have no effect in the current local runner", UserWarning),
)


@contextlib.contextmanager
def expected_warnings_silenced() -> Iterator[None]:
    with warnings.catch_warnings():
        for message, category in EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


class LocalRunError(TritonshipError):
    """The pipeline failed under the local runner; `log` is what its tasks printed (quiet runs capture it)."""

    exit_code = 1

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass
class LocalRun:
    """One local pipeline run: its output folder and the outputs of its tasks."""

    root: Path
    log: str = ""
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path, log: str = "") -> LocalRun:
        outputs = {}
        for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            executor_output = task_dir / "executor_output.json"
            if executor_output.exists():
                outputs[task_dir.name] = json.loads(executor_output.read_text())
        return cls(root, log, outputs)

    def parameter(self, task: str, name: str) -> Any:
        return self.outputs.get(task, {}).get("parameterValues", {}).get(name)

    def artifact(self, task: str, name: str) -> dict[str, Any] | None:
        artifacts = self.outputs.get(task, {}).get("artifacts", {}).get(name, {}).get("artifacts", [])
        return artifacts[0] if artifacts else None

    @property
    def verdict(self) -> dict[str, Any] | None:
        text = self.parameter("gate-op", "verdict_json")
        return json.loads(text) if text else None

    @property
    def version(self) -> int | None:
        version = self.parameter("publish-op", "version")
        return int(version) if version is not None else None

    @property
    def promoted(self) -> bool:
        return self.parameter("promote-op", "promoted") is True

    @property
    def promotion(self) -> dict[str, Any] | None:
        """The promote step's PromoteResult (with its canary), where it ran."""
        text = self.parameter("promote-op", "promote_json")
        return json.loads(text) if text else None

    @property
    def rejected(self) -> bool:
        return "reject-op" in self.outputs


RUNNERS = ("subprocess", "docker")


def run_local(
    parameters: dict[str, Any],
    pipeline_root: Path,
    env: dict[str, str] | None = None,
    quiet: bool = True,
    runner: str = "subprocess",
    pipeline: Callable[..., Any] | None = None,
) -> LocalRun:
    """Run `pipeline` (default: `release_pipeline`) with `parameters` under KFP's local runner: "subprocess" runs
    every task in this environment (no venv), "docker" each in its image, built here (pipelines/container_runner.py).

    `env` (S3 credentials, for example) is set for the run's tasks, as this process's environment, which
    subprocesses inherit, or as each container's; it is never a pipeline parameter.
    """
    if runner not in RUNNERS:
        raise LocalRunError(f"the local runner {runner!r} is not one of {', '.join(RUNNERS)}.")
    with contextlib.ExitStack() as stack:
        if runner == "docker":
            from pipelines.container_runner import docker_runner, local_images

            kfp_runner = stack.enter_context(docker_runner(env or {}, local_images()))
            env = {}
        else:
            from kfp import local

            kfp_runner = local.SubprocessRunner(use_venv=False)
        return _run(parameters, pipeline_root.resolve(), kfp_runner, env or {}, quiet, pipeline)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def task_error(log: str) -> str:
    """The error the last failed task ended with, from the runner's captured output: a refusal's own line
    (`error: …`, components/errors.py), or the last line of its traceback without the exception's module path."""
    lines = [_ANSI.sub("", line) for line in log.splitlines()]
    refusals = [i for i, line in enumerate(lines) if line.strip().startswith(REFUSAL_PREFIX)]
    starts = [i for i, line in enumerate(lines) if line.strip() == "Traceback (most recent call last):"]
    if refusals and (not starts or refusals[-1] > starts[-1]):
        return lines[refusals[-1]].strip().removeprefix(REFUSAL_PREFIX)
    if not starts:
        return ""
    indent = len(lines[starts[-1]]) - len(lines[starts[-1]].lstrip())
    for line in lines[starts[-1] + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) == indent:
            return re.sub(r"^[\w.]*?(\w+): ", r"\1: ", line.strip())
    return ""


def _run(
    parameters: dict[str, Any],
    pipeline_root: Path,
    runner: Any,
    env: dict[str, str],
    quiet: bool,
    pipeline: Callable[..., Any] | None,
) -> LocalRun:
    from kfp import local

    if pipeline is None:
        from pipelines.pipeline import release_pipeline as pipeline

    pipeline_root.mkdir(parents=True, exist_ok=True)
    before = set(pipeline_root.iterdir())
    local.init(runner=runner, pipeline_root=str(pipeline_root), raise_on_error=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    log = io.StringIO()
    kfp_logger = logging.getLogger("kfp")
    previous_level = kfp_logger.level
    try:
        if quiet:
            kfp_logger.setLevel(logging.WARNING)
        with contextlib.redirect_stdout(log) if quiet else contextlib.nullcontext(), expected_warnings_silenced():
            pipeline(**parameters)
    except Exception as exc:
        said = _ANSI.sub("", str(exc).splitlines()[0])
        cause = task_error(log.getvalue())
        raise LocalRunError(
            f"the pipeline failed under the local runner: {said}{f' {cause}' if cause else ''}", log.getvalue()
        ) from None
    finally:
        kfp_logger.setLevel(previous_level)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    created = sorted(set(pipeline_root.iterdir()) - before, key=lambda p: p.stat().st_mtime)
    if not created:
        raise LocalRunError(f"the local runner wrote no run folder under {pipeline_root}.")
    return LocalRun.read(created[-1], log.getvalue())
