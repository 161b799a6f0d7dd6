"""Compiling the pipeline, typing its parameters, and thin wrappers over kfp.Client for runs and schedules."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from components.errors import TritonshipError

COMPILED = Path(__file__).resolve().parent / "release_pipeline.yaml"
RELEASE_PIPELINE = "pipelines.pipeline:release_pipeline"
DEFAULT_SERVICE_ACCOUNT = "tritonship-pipeline"  # manifests/rbac/
# Seconds to connect to the KFP API, then to hear its health endpoint answer: how long a silent host is waited for.
PROBE_TIMEOUT = (10.0, 30.0)
ENDPOINT_HINT = "(for example https://host/pipeline, or http://localhost:8888 through a port-forward)"


def load_pipeline(source: str = RELEASE_PIPELINE) -> Any:
    """The @dsl.pipeline `package.module:function` names: tritonship's release pipeline, or one of the user's, such
    as a training pipeline that ends in the release (pipelines/examples/train_and_release.py)."""
    module_name, _, name = source.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), name, None)
    except ImportError as exc:
        raise TritonshipError(f"--pipeline {source}: cannot import {module_name!r} ({exc}); check the name.") from None
    if not hasattr(found, "pipeline_func"):
        raise TritonshipError(f"--pipeline {source} is not a @dsl.pipeline; give package.module:function of one.")
    return found


def compile_pipeline(path: Path = COMPILED, registry: str | None = None, pipeline: str = RELEASE_PIPELINE) -> Path:
    """Compile the pipeline to `path`; with `registry` (host[:port][/path]) its images are named there."""
    from kfp import compiler

    from pipelines.images import in_registry, matrix

    renamed = {name: in_registry(name, registry) for name in matrix()["images"].values()}  # a bad registry: no file
    compiler.Compiler().compile(load_pipeline(pipeline), str(path))
    renamed = {old: new for old, new in renamed.items() if new != old}
    if renamed:
        # Text, not YAML, so that KFP's layout and header comment stay; an image's name is matched whole, also where a
        # parameter's default names it.
        exact = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, renamed)) + r")(?![\w.-])")
        path.write_text(exact.sub(lambda m: renamed[m.group(1)], path.read_text()))
    return path


def parameter_types(pipeline: str = RELEASE_PIPELINE) -> dict[str, type]:
    """Each parameter's type: its default's, or its annotation where it has none."""
    found = inspect.signature(load_pipeline(pipeline).pipeline_func, eval_str=True).parameters
    return {n: p.annotation if p.default is inspect.Parameter.empty else type(p.default) for n, p in found.items()}


def parse_parameters(pairs: list[str], pipeline: str = RELEASE_PIPELINE) -> dict[str, Any]:
    """`name=value` pairs typed like the pipeline's parameters (values are YAML: 4, 1.5, {a: b}, [..])."""
    kinds = parameter_types(pipeline)
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep:
            raise TritonshipError(f"parameter {pair!r} is not name=value.")
        if name not in kinds:
            raise TritonshipError(f"the pipeline has no parameter {name!r}; it has: {', '.join(kinds)}.")
        kind = kinds[name]
        value: Any = text
        if kind is not str:
            try:
                value = yaml.safe_load(text)
            except yaml.YAMLError:
                raise TritonshipError(f"parameter {name}: {text!r} is not a valid value.") from None
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not kind:
                raise TritonshipError(f"parameter {name} takes a {kind.__name__}, not {text!r}.")
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


def submit(
    host: str,
    parameters: dict[str, Any],
    run_name: str,
    experiment: str,
    service_account: str,
    registry: str | None = None,
    pipeline: str = RELEASE_PIPELINE,
) -> str:
    with tempfile.TemporaryDirectory(prefix="tritonship-kfp-") as tmp:
        package = compile_pipeline(Path(tmp) / "pipeline.yaml", registry, pipeline)
        with kfp_client(host) as client:
            result = client.create_run_from_pipeline_package(
                str(package),
                arguments=parameters,
                run_name=run_name,
                experiment_name=experiment,
                service_account=service_account,
            )
    return result.run_id


def schedule(
    host: str,
    parameters: dict[str, Any],
    name: str,
    cron: str,
    experiment: str,
    service_account: str,
    registry: str | None = None,
    pipeline: str = RELEASE_PIPELINE,
) -> str:
    validate_cron(cron)
    with tempfile.TemporaryDirectory(prefix="tritonship-kfp-") as tmp:
        package = compile_pipeline(Path(tmp) / "pipeline.yaml", registry, pipeline)
        with kfp_client(host) as client:
            experiment_id = client.create_experiment(experiment).experiment_id
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


@contextlib.contextmanager
def kfp_client(host: str) -> Iterator[Any]:
    """A kfp.Client for the KFP API at `host`, whose every failure in the block, from the constructor's health
    probe on, is one sentence naming the host and what to check."""
    import kfp_server_api
    import urllib3

    host = host.strip()
    if not host:
        raise TritonshipError(f"--host is empty; give the Kubeflow Pipelines API endpoint {ENDPOINT_HINT}.")
    url = (host if "://" in host else f"https://{host}").rstrip("/")  # kfp.Client's default scheme, said here
    try:
        yield _connect(url)
    except kfp_server_api.ApiException as exc:
        raise TritonshipError(_answered(url, exc)) from None
    except urllib3.exceptions.HTTPError as exc:
        raise TritonshipError(_unreachable(url, exc)) from None


def _connect(url: str) -> Any:
    import kfp
    import urllib3
    from kfp.client import KF_PIPELINES_SA_TOKEN_ENV, ServiceAccountTokenVolumeCredentials

    class OneTry(kfp.Client):
        """kfp.Client trying each request once: urllib3 would retry a refused connection three times, logging each
        try, and kfp.Client's health probe tries five times, five seconds apart, without a timeout."""

        def _load_config(self, *args: Any, **kwargs: Any) -> Any:
            config = super()._load_config(*args, **kwargs)
            # redirect=False hands a redirect (to a login page, say) back as the answer it is, an ApiException.
            config.retries = urllib3.Retry(total=0, redirect=False)
            return config

        def get_kfp_healthz(self, sleep_duration: int = 5) -> Any:
            return self._healthz_api.healthz_service_get_healthz(_request_timeout=PROBE_TIMEOUT)

    credentials = None
    token_path = os.environ.get(KF_PIPELINES_SA_TOKEN_ENV)
    if token_path:  # kfp.Client reads it only in a cluster's pod; given a host, it sends no token unless told to
        try:
            Path(token_path).read_text()
        except OSError as exc:
            raise TritonshipError(
                f"{KF_PIPELINES_SA_TOKEN_ENV} names {token_path}, which cannot be read "
                f"({(exc.strerror or str(exc)).lower()}); point it at the file that holds your Kubeflow token."
            ) from None
        credentials = ServiceAccountTokenVolumeCredentials(token_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "This client only works with Kubeflow Pipeline v2.0.0-beta.2"
        client = OneTry(host=url, credentials=credentials)
    if client.get_user_namespace():  # the constructor probes the API only when ~/.config/kfp/context.json names none
        client.get_kfp_healthz()
    return client


def _unreachable(url: str, exc: Exception) -> str:
    from urllib3.exceptions import (
        MaxRetryError,
        NameResolutionError,
        NewConnectionError,
        ProtocolError,
        ReadTimeoutError,
        SSLError,
    )
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    reason = exc.reason if isinstance(exc, MaxRetryError) and exc.reason is not None else exc
    if isinstance(reason, SSLError):
        return (
            f"the TLS handshake with {url} failed ({_first_line(reason)}); check the URL's scheme (http:// or "
            "https://) and that this machine trusts the server's certificate."
        )
    if isinstance(reason, NameResolutionError):
        why = "its host name does not resolve"
    elif isinstance(reason, NewConnectionError):  # a subclass of ConnectTimeoutError: before the timeouts
        cause = reason.__cause__
        why = (getattr(cause, "strerror", None) or "no connection").lower()
    elif isinstance(reason, ReadTimeoutError):
        why = f"it accepted the connection but did not answer within {PROBE_TIMEOUT[1]:g} s"
    elif isinstance(reason, Urllib3Timeout):
        why = f"no connection within {PROBE_TIMEOUT[0]:g} s"
    elif isinstance(reason, ProtocolError):
        why = "the connection closed without an answer"
    else:
        why = _first_line(reason)
    return (
        f"could not reach the Kubeflow Pipelines API at {url} ({why}); check that the URL is its endpoint "
        f"{ENDPOINT_HINT} and that it is reachable from here."
    )


def _answered(url: str, exc: Any) -> str:
    """The sentence for the KFP API's error answer (a kfp_server_api.ApiException)."""
    status, reason = exc.status or 0, (exc.reason or "").strip()
    said = f"HTTP {status} {reason}".strip()
    credentials = (
        "kfp.Client sends the bearer token in the file KF_PIPELINES_SA_TOKEN_PATH names (in place of its "
        "existing_token) or the client_authentication_cookie of ~/.config/kfp/context.json, so check that one is set "
        "and that this host accepts it"
    )
    if status == 0:  # no answer at all: kfp_server_api reports a TLS failure this way
        return (
            f"could not talk to the Kubeflow Pipelines API at {url} ({_first_line(reason)}); check that the URL is "
            f"its endpoint {ENDPOINT_HINT} and that it is reachable from here."
        )
    if status in (401, 403):
        return f"the Kubeflow Pipelines API at {url} refused the credentials ({said}); {credentials}."
    if 300 <= status < 400:
        where = (exc.headers or {}).get("Location", "elsewhere")
        return f"{url} redirected to {where} ({said}), usually a login page; {credentials}."
    if status == 404:
        return (
            f"{url} has no Kubeflow Pipelines API ({said}); give the Pipelines API's base URL as the endpoint "
            f"{ENDPOINT_HINT}."
        )
    message = _server_message(exc.body)
    return (
        f"the Kubeflow Pipelines API at {url} answered {said}{f' ({message})' if message else ''}; "
        "check the request and the server's logs."
    )


def _server_message(body: bytes | str | None) -> str:
    try:
        answer = json.loads(body or "{}")
    except ValueError:
        return ""
    if not isinstance(answer, dict):
        return ""
    message = answer.get("message") or answer.get("error_message")
    return _first_line(message)[:200] if message else ""


def _first_line(what: object) -> str:
    return str(what).strip().splitlines()[0] if str(what).strip() else "no detail"
