"""Compiling the pipeline, typing its parameters, and thin wrappers over kfp.Client for runs and schedules."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import yaml

from components.errors import TritonshipError

COMPILED = Path(__file__).resolve().parent / "release_pipeline.yaml"
DEFAULT_SERVICE_ACCOUNT = "tritonship-pipeline"  # manifests/rbac/


def compile_pipeline(path: Path = COMPILED) -> Path:
    from kfp import compiler

    from pipelines.pipeline import release_pipeline

    compiler.Compiler().compile(release_pipeline, str(path))
    return path


def parameter_types() -> dict[str, Any]:
    from pipelines.pipeline import release_pipeline

    return {n: p.default for n, p in inspect.signature(release_pipeline.pipeline_func).parameters.items()}


def parse_parameters(pairs: list[str]) -> dict[str, Any]:
    """`name=value` pairs typed like the pipeline's parameters (values are YAML: 4, 1.5, {a: b}, [..])."""
    defaults = parameter_types()
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise TritonshipError(f"parameter {pair!r} is not name=value.")
        if name not in defaults:
            raise TritonshipError(f"the pipeline has no parameter {name!r}; it has: {', '.join(defaults)}.")
        default = defaults[name]
        value: Any = text
        if not isinstance(default, str):
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                raise TritonshipError(f"parameter {name}: {text!r} is not a valid value.") from None
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not type(default):
                raise TritonshipError(f"parameter {name} takes a {type(default).__name__}, not {text!r}.")
        out[name] = value
    return out


def validate_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) != 6:
        raise TritonshipError(
            f"cron expression {expression!r} has {len(fields)} fields; KFP takes 6, seconds first "
            "(for example '0 0 3 * * *' for 03:00 every day)."
        )
    return expression


def submit(host: str, parameters: dict[str, Any], run_name: str, experiment: str, service_account: str) -> str:
    import kfp

    package = compile_pipeline(Path(_tmp()) / "release_pipeline.yaml")
    result = kfp.Client(host=host).create_run_from_pipeline_package(
        str(package),
        arguments=parameters,
        run_name=run_name,
        experiment_name=experiment,
        service_account=service_account,
    )
    return result.run_id


def schedule(host: str, parameters: dict[str, Any], name: str, cron: str, experiment: str, service_account: str) -> str:
    import kfp

    validate_cron(cron)
    client = kfp.Client(host=host)
    experiment_id = client.create_experiment(experiment).experiment_id
    package = compile_pipeline(Path(_tmp()) / "release_pipeline.yaml")
    job = client.create_recurring_run(
        experiment_id,
        name,
        cron_expression=cron,
        params=parameters,
        pipeline_package_path=str(package),
        max_concurrency=1,
        no_catchup=True,
        service_account=service_account,
    )
    return job.recurring_run_id


def _tmp() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="tritonship-kfp-")
