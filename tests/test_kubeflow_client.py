"""`tritonship submit|schedule` against a Kubeflow Pipelines API that does not answer as one: one sentence naming the
host, no traceback, no retries; and `--registry`, which renames the compiled pipeline's images."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.images import in_registry, matrix
from pipelines.kubeflow import COMPILED, compile_pipeline

# Nothing from the environment of whoever runs the tests: the CLI reads these.
CLEAN_ENV = {"KFP_HOST": None, "TRITONSHIP_REGISTRY": None, "KF_PIPELINES_SA_TOKEN_PATH": None, "COLUMNS": "200"}
CRON = ["--cron", "0 0 3 * * *"]


@contextmanager
def answering(status: int) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server on 127.0.0.1 answering every request with `status`; yields its URL and the requests' headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = json.dumps({"error_message": "the server says no", "code": 13}).encode()
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "https://login.example.com/dex/auth")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def invoke(*argv: str, **env: str | None) -> str:
    """The CLI's output, which must be one `error:` sentence and a non-zero exit."""
    result = CliRunner().invoke(app, list(argv), env={**CLEAN_ENV, **env})
    output = result.output.strip()
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), (output, result.exception)
    for noise in ("Traceback", "MaxRetryError", "Retrying", "Warning"):
        assert noise not in output, output
    assert output.startswith("error: ") and output.count("error:") == 1, output
    assert len(output.splitlines()) == 1, output
    return output


COMMANDS = [pytest.param(["submit"], id="submit"), pytest.param(["schedule", *CRON], id="schedule")]


@pytest.mark.parametrize("command", COMMANDS)
def test_nothing_listening_is_one_sentence_naming_the_host(command):
    host = f"http://127.0.0.1:{closed_port()}"
    output = invoke(*command, "--host", host)
    assert f"could not reach the Kubeflow Pipelines API at {host} (connection refused)" in output
    assert "https://host/pipeline" in output and "reachable" in output and output.endswith(".")


def test_a_name_that_does_not_resolve_is_one_sentence():
    output = invoke("submit", "--host", "kfp.does-not-exist.invalid")
    assert "at https://kfp.does-not-exist.invalid (its host name does not resolve)" in output


def test_a_host_that_never_answers_is_given_up_on_after_the_probe_timeout(monkeypatch):
    monkeypatch.setattr("pipelines.kubeflow.PROBE_TIMEOUT", (1.0, 1.0))
    with socket.socket() as silent:  # listens, so connections complete, but never accepts or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        output = invoke("submit", "--host", host)
    assert f"at {host} (it accepted the connection but did not answer within 1 s)" in output


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (401, "refused the credentials (HTTP 401 Unauthorized); kfp.Client sends"),
        (403, "refused the credentials (HTTP 403 Forbidden); kfp.Client sends"),
        (404, "has no Kubeflow Pipelines API (HTTP 404 Not Found); give the Pipelines API's base URL"),
        (302, "redirected to https://login.example.com/dex/auth (HTTP 302 Found), usually a login page"),
        (500, "answered HTTP 500 Internal Server Error (the server says no)"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS)
def test_an_http_error_is_one_sentence_naming_the_host(command, status, says):
    with answering(status) as (host, seen):
        output = invoke(*command, "--host", host)
    assert host in output and says in output and output.endswith("."), output
    if status in (401, 403):
        assert "KF_PIPELINES_SA_TOKEN_PATH" in output and "existing_token" in output and "cookie" in output
    assert len(seen) == 1, "one request, tried once: the constructor's health probe"


def test_the_token_file_is_sent_and_an_unreadable_one_is_one_sentence(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    with answering(401) as (host, seen):
        output = invoke("submit", "--host", host, KF_PIPELINES_SA_TOKEN_PATH=str(token))
    assert "refused the credentials" in output and "s3cr3t" not in output
    assert seen[0].get("authorization") == "Bearer s3cr3t-token"
    output = invoke("submit", "--host", host, KF_PIPELINES_SA_TOKEN_PATH=str(tmp_path / "missing"))
    assert f"KF_PIPELINES_SA_TOKEN_PATH names {tmp_path / 'missing'}, which cannot be read" in output


def test_a_bad_cron_or_registry_is_refused_before_the_host_is_asked():
    host = f"http://127.0.0.1:{closed_port()}"
    assert "KFP takes 6, seconds first" in invoke("schedule", "--host", host, "--cron", "0 3 * * *")
    assert "the registry 'Registry.Example.com'" in invoke(
        "submit", "--host", host, "--registry", "Registry.Example.com"
    )


# ------------------------------------------------------------------------------------------------- --registry
def executor_images(path: Path) -> dict[str, str]:
    """Each executor's image; one that a pipeline parameter names (set_container_image) as that one's default."""
    first = next(yaml.safe_load_all(path.read_text()))
    defaults = {n: p.get("defaultValue") for n, p in first["root"]["inputDefinitions"]["parameters"].items()}
    images = {}
    for name, executor in first["deploymentSpec"]["executors"].items():
        image = executor["container"]["image"]
        parameter = re.fullmatch(r"\{\{\$\.inputs\.parameters\['pipelinechannel--(\w+)'\]\}\}", image)
        images[name] = defaults[parameter.group(1)] if parameter else image
    return images


def test_compiling_for_a_registry_names_every_image_there(tmp_path):
    before = COMPILED.read_text()
    path = compile_pipeline(tmp_path / "p.yaml", "registry.example.com/ml")
    text = path.read_text()
    assert "ghcr.io/tritonship" not in text
    assert text.startswith("# PIPELINE DEFINITION")
    images = executor_images(path)
    assert all(re.fullmatch(r"registry\.example\.com/ml/(compile|gate|tools):[\w.-]+", i) for i in images.values())
    moved = {in_registry(name, "registry.example.com/ml") for name in matrix()["images"].values()}
    assert set(images.values()) == moved
    plain = executor_images(compile_pipeline(tmp_path / "plain.yaml"))
    assert images == {e: in_registry(i, "registry.example.com/ml") for e, i in plain.items()}
    assert COMPILED.read_text() == before


def test_the_registry_option_and_its_variable_reach_the_compiled_file(tmp_path):
    for name, argv, env in [
        ("option.yaml", ["--registry", "localhost:5000/team"], {}),
        ("env.yaml", [], {"TRITONSHIP_REGISTRY": "localhost:5000/team"}),
    ]:
        out = tmp_path / name
        result = CliRunner().invoke(app, ["pipeline", "compile", "--out", str(out), *argv], env={**CLEAN_ENV, **env})
        assert result.exit_code == 0, result.output
        assert {i.rsplit("/", 1)[0] for i in executor_images(out).values()} == {"localhost:5000/team"}


@pytest.mark.parametrize("registry", ["Registry.Example.com", "registry example.com"])
def test_a_bad_registry_is_one_sentence_and_writes_nothing(tmp_path, registry):
    out = tmp_path / "p.yaml"
    output = invoke("pipeline", "compile", "--out", str(out), "--registry", registry)
    assert f"the registry {registry!r} is not host[:port][/path]" in output
    assert not out.exists()


def test_without_a_registry_the_yaml_is_the_plain_compile(tmp_path):
    from kfp import compiler

    from pipelines.pipeline import release_pipeline

    compiler.Compiler().compile(release_pipeline, str(tmp_path / "kfp.yaml"))
    plain = list(yaml.safe_load_all((tmp_path / "kfp.yaml").read_text()))
    for registry in (None, ""):
        ours = compile_pipeline(tmp_path / "ours.yaml", registry)
        assert list(yaml.safe_load_all(ours.read_text())) == plain


def test_a_training_pipeline_compiles_and_takes_its_own_parameters(tmp_path):
    """--pipeline: the training example, whose train and export tasks run in model_image, for a scheduled run."""
    from pipelines.kubeflow import parse_parameters

    example = "pipelines.examples.train_and_release:train_and_release"
    out = tmp_path / "train.yaml"
    result = CliRunner().invoke(
        app,
        ["pipeline", "compile", "--pipeline", example, "--out", str(out), "--registry", "r.example/ml"],
        env=CLEAN_ENV,
    )
    assert result.exit_code == 0, result.output
    images = executor_images(out)
    assert images["exec-train-op"] == images["exec-export-trained-op"] == "r.example/ml/tools:0.1.0"  # model_image's
    assert images["exec-compile-op"] == "r.example/ml/compile:0.1.0-26.10"
    given = parse_parameters(["trainer=mypkg.train:train", "seed=3", "repository=s3://m/p"], example)
    assert given == {"trainer": "mypkg.train:train", "seed": 3, "repository": "s3://m/p"}
    assert "cannot import 'no.such'" in invoke("pipeline", "compile", "--pipeline", "no.such:pipeline")
    said = invoke("pipeline", "compile", "--pipeline", "pipelines.kubeflow:compile_pipeline")
    assert "is not a @dsl.pipeline" in said
