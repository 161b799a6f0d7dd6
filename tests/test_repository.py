"""The S3 model repository against the embedded (real) S3 server: immutability, atomicity, concurrency, history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from botocore.exceptions import ClientError

from components.model import model_config
from components.model.model_folder import ModelFolderError
from components.release.publish import PublishError, publish
from components.release.run_context import RunContext
from components.repository import LeaseHeld, Leases, ModelRepository, RepositoryError, Versions, candidate_name
from components.s3 import S3Error, S3Settings
from components.serving.triton_admin import TritonAdmin
from pipelines.stack import ManagedProcess, free_port, port_is_open
from tests.models import mlp_folder

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo(stack) -> ModelRepository:
    return ModelRepository(f"s3://{stack.bucket}", stack.s3)


def _name() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


def _keys(s3, bucket: str, prefix: str = "") -> set[str]:
    return {
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    }


def test_s3_server_honours_conditional_writes(stack, s3):
    key = f"probe/{uuid.uuid4().hex}"
    first = s3.put_object(Bucket=stack.bucket, Key=key, Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=stack.bucket, Key=key, Body=b"2", IfNoneMatch="*")
    s3.put_object(Bucket=stack.bucket, Key=key, Body=b"3", IfMatch=first["ETag"])
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=stack.bucket, Key=key, Body=b"4", IfMatch=first["ETag"])  # stale ETag
    assert s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read() == b"3"


def test_publish_then_read_back_byte_identical(tmp_path, stack, repo):
    name = _name()
    folder = mlp_folder(tmp_path, name)
    result = publish(RunContext(repo.uri, "", s3=stack.s3), folder=folder)
    assert (result.version, result.resumed) == (1, False)
    assert result.uri == f"s3://{stack.bucket}/staging/{candidate_name(name)}/1/"
    manifest = repo.download_version(name, 1, staged=True, dest=tmp_path / "back")
    local = {p.name: p for p in (folder / "1").iterdir()} | {"config.pbtxt": folder / "config.pbtxt"}
    assert set(manifest.files) == set(local)
    for rel, path in local.items():
        assert (tmp_path / "back" / rel).read_bytes() == path.read_bytes()
    assert manifest.signature["inputs"][0]["name"] == "x" and manifest.fingerprint == {"test": True}
    assert repo.versions(name, staged=True) == [1] and repo.versions(name, staged=False) == []
    assert [e["event"] for e in repo.history(name)] == ["published"]


def test_publishing_the_same_content_again_in_the_same_run_is_idempotent(tmp_path, stack, repo):
    name = _name()
    folder = mlp_folder(tmp_path, name)
    first = publish(RunContext(repo.uri, "", s3=stack.s3, run_id="run-a"), folder=folder)
    again = publish(RunContext(repo.uri, "", s3=stack.s3, run_id="run-a"), folder=folder)
    other = publish(RunContext(repo.uri, "", s3=stack.s3, run_id="run-b"), folder=folder)
    assert (first.version, again.version, again.resumed, other.version) == (1, 1, True, 2)


def test_concurrent_publishes_from_threads_get_distinct_versions(tmp_path, stack, repo):
    name = _name()
    folders = [mlp_folder(tmp_path / str(i), name, seed=i) for i in range(6) if (tmp_path / str(i)).mkdir() is None]
    results, errors = [], []

    def run(folder: Path) -> None:
        try:
            results.append(publish(RunContext(repo.uri, "", s3=stack.s3), folder=folder))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in folders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(r.version for r in results) == [1, 2, 3, 4, 5, 6]
    assert repo.versions(name, staged=True) == [1, 2, 3, 4, 5, 6]
    for r in results:  # each version holds exactly the content its publisher sent
        assert repo.manifest(name, r.version, staged=True).digest == r.digest
        assert repo.verify(name, r.version, staged=True) == []


def test_concurrent_publishes_from_processes_get_distinct_versions(tmp_path, stack, repo):
    name = _name()
    env = {**os.environ, **stack.s3.env()}
    procs = []
    for i in range(3):
        (tmp_path / str(i)).mkdir()
        folder = mlp_folder(tmp_path / str(i), name, seed=i)
        cmd = [sys.executable, "-m", "pipelines.cli", "publish", str(folder), "-r", repo.uri, "--run-id", f"proc-{i}"]
        procs.append(
            subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    versions = sorted(int(o.split(" version ")[1].split()[0]) for o, _ in outputs)
    assert versions == [1, 2, 3] and repo.versions(name, staged=True) == [1, 2, 3]


def test_publish_killed_half_way_leaves_nothing_visible_and_a_rerun_completes(tmp_path, stack, repo, s3):
    name = _name()
    folder = mlp_folder(tmp_path, name)
    (folder / "1" / "weights.bin").write_bytes(np.random.default_rng(0).bytes(160 * 2**20))  # slow enough to kill
    env = {**os.environ, **stack.s3.env()}
    cmd = [sys.executable, "-m", "pipelines.cli", "publish", str(folder), "-r", repo.uri, "--run-id", "killed"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prefix = f"staging/{candidate_name(name)}/1/"
    deadline = time.monotonic() + 60
    # listed by prefix: a listing of the whole bucket, which the suite fills, can outlast the big upload
    while time.monotonic() < deadline and not _keys(s3, stack.bucket, prefix):
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    written = _keys(s3, stack.bucket, prefix)
    assert written and prefix + "manifest.json" not in written, (
        "the kill must land between the first file and the manifest"
    )
    assert repo.versions(name, staged=True) == []  # readers see nothing
    assert repo.incomplete_versions(name) == [(1, True)]

    rerun = publish(RunContext(repo.uri, "", s3=stack.s3, run_id="killed"), folder=folder)
    assert (rerun.version, rerun.resumed) == (1, True)
    assert repo.versions(name, staged=True) == [1] and repo.verify(name, 1, staged=True) == []
    assert repo.incomplete_versions(name) == []


def test_gc_removes_only_versions_without_manifest_after_the_grace_period(tmp_path, stack, repo, s3):
    name = _name()
    publish(RunContext(repo.uri, "", s3=stack.s3), folder=mlp_folder(tmp_path, name))
    version = repo.allocate_version(name, {"run_id": "crashed"})
    s3.put_object(Bucket=stack.bucket, Key=f"staging/{candidate_name(name)}/{version}/model.pt", Body=b"partial")
    assert repo.gc(grace_seconds=3600, model=name) == []  # a publish could still be running
    assert repo.gc(grace_seconds=0, dry_run=True, model=name) == [
        f"s3://{stack.bucket}/staging/{candidate_name(name)}/{version}/"
    ]
    assert repo.incomplete_versions(name) == [(version, True)]
    repo.gc(grace_seconds=0, model=name)
    assert repo.incomplete_versions(name) == [] and repo.versions(name, staged=True) == [1]
    assert repo.allocate_version(name, {}) == version + 1  # numbers are never reused


def test_verify_catches_a_tampered_file(tmp_path, stack, repo, s3):
    name = _name()
    publish(RunContext(repo.uri, "", s3=stack.s3), folder=mlp_folder(tmp_path, name))
    assert repo.verify(name, 1, staged=True) == []
    s3.put_object(Bucket=stack.bucket, Key=f"staging/{candidate_name(name)}/1/model.pt", Body=b"tampered")
    problems = repo.verify(name, 1, staged=True)
    assert problems == [f"{name} v1: model.pt does not match its manifest (sha256 or size differ)"]
    cli = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "repo", "verify", name, "-r", repo.uri],
        env={**os.environ, **stack.s3.env()},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1 and "MISMATCH" in cli.stdout
    with pytest.raises(RepositoryError, match="fails verification"):
        repo.copy_to_production(name, 1)
    assert repo.versions(name, staged=False) == []


def test_published_version_loads_in_triton_from_s3_staging_and_production(tmp_path, stack, repo):
    name = _name()
    folder = mlp_folder(tmp_path, name)
    publish(RunContext(repo.uri, "", s3=stack.s3), folder=folder)
    config = model_config.parse_pbtxt((folder / "config.pbtxt").read_text())
    golden = np.load(folder / "1" / "golden.npz")
    candidate = model_config.pin_version(model_config.renamed(config, candidate_name(name)), 1)
    with TritonAdmin(stack.gate.http_url) as gate:
        gate.load(candidate_name(name), candidate)
        out = gate.infer(candidate_name(name), {"x": golden["in:x"][:4]}, ["y"])
        np.testing.assert_allclose(out["y"], golden["out:y"][:4], rtol=1e-5)
        gate.unload(candidate_name(name))

    repo.copy_to_production(name, 1)
    assert repo.versions(name, staged=False) == [1]
    etag = repo.write_desired_config(name, model_config.pin_version(config, 1), None)
    with pytest.raises(RepositoryError, match="another writer got there first"):
        repo.write_desired_config(name, model_config.pin_version(config, 1), None)  # already exists
    two_instances = model_config.with_settings(
        model_config.pin_version(config, 1), model_config.ServingSettings(instance_count=2)
    )
    repo.write_desired_config(name, two_instances, etag)
    with pytest.raises(RepositoryError, match="another writer got there first"):
        repo.write_desired_config(name, model_config.pin_version(config, 1), etag)  # stale ETag
    assert repo.desired_config(name)[0] == two_instances
    with TritonAdmin(stack.replicas[0].http_url) as prod:
        prod.load(name)  # from the desired state in S3 alone
        assert prod.ready_versions(name) == [1]
        prod.unload(name)


def test_missing_bucket_and_wrong_endpoint_are_clear_and_write_nothing(tmp_path, stack, s3):
    folder = mlp_folder(tmp_path, "nb")
    before = _keys(s3, stack.bucket)
    # The pipeline's principal has no rights outside its bucket: S3 answers 403 whether or not it exists.
    with pytest.raises(S3Error, match=r"S3 denied access to bucket 'no-such-bucket' \(or it does not exist"):
        publish(RunContext("s3://no-such-bucket/root", "", s3=stack.s3), folder=folder)
    wrong = S3Settings(f"http://127.0.0.1:{free_port()}", access_key_id="a", secret_access_key="b", max_attempts=1)
    with pytest.raises(S3Error, match="could not be reached"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=wrong), folder=folder)
    assert _keys(s3, stack.bucket) == before


def test_denied_credentials_are_reported_without_the_secret(tmp_path):
    """A second S3 server that authenticates every request (moto's INITIAL_NO_AUTH_ACTION_COUNT=0)."""
    port = free_port()
    server = ManagedProcess(
        "s3-auth",
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        tmp_path / "s3.log",
    )
    server.start()
    try:
        deadline = time.monotonic() + 30
        while not port_is_open(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        secret = "s3cr3t-" + uuid.uuid4().hex
        denied = S3Settings(f"http://127.0.0.1:{port}", access_key_id="AKIAUNKNOWN", secret_access_key=secret)
        with pytest.raises(S3Error) as info:
            publish(RunContext("s3://bucket", "", s3=denied), folder=mlp_folder(tmp_path, "denied"))
        assert "denied access" in str(info.value) and secret not in str(info.value)
        assert secret not in repr(denied)
    finally:
        server.stop()


def test_incomplete_or_inconsistent_folders_are_refused_before_anything_is_written(tmp_path, stack, s3):
    before = _keys(s3, stack.bucket)
    no_config = mlp_folder(tmp_path, "nc")
    (no_config / "config.pbtxt").unlink()
    with pytest.raises(ModelFolderError, match="has no config.pbtxt"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=stack.s3), folder=no_config)
    (tmp_path / "b").mkdir()
    no_model = mlp_folder(tmp_path / "b", "nm")
    (no_model / "1" / "model.pt").unlink()
    with pytest.raises(ModelFolderError, match="has no 1/model.pt"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=stack.s3), folder=no_model)
    (tmp_path / "c").mkdir()
    mismatched = mlp_folder(tmp_path / "c", "mm")
    text = (mismatched / "config.pbtxt").read_text().replace("dims: 16", "dims: 17")
    (mismatched / "config.pbtxt").write_text(text)
    with pytest.raises(model_config.ModelConfigError, match="input 'x' dims are \\[17\\], the signature says \\[16\\]"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=stack.s3), folder=mismatched)
    (tmp_path / "d").mkdir()
    bad_name = mlp_folder(tmp_path / "d", "ok")
    (bad_name / "config.pbtxt").write_text(
        (bad_name / "config.pbtxt").read_text().replace('name: "ok"', 'name: "../x"')
    )
    with pytest.raises(model_config.ModelConfigError, match="model name '../x' is not valid"):
        publish(RunContext(f"s3://{stack.bucket}", "", s3=stack.s3), folder=bad_name)
    other = mlp_folder(tmp_path / "b", "other")  # a context that names a model publishes that model's folder only
    with pytest.raises(PublishError) as refused:
        publish(RunContext(f"s3://{stack.bucket}", "elsewhere", s3=stack.s3), folder=other)
    assert str(refused.value) == (
        "the folder holds the model 'other', not 'elsewhere'; publish the folder of 'elsewhere', or name no model: "
        "publish takes it from the folder."
    )
    assert _keys(s3, stack.bucket) == before


def test_repo_cli_lists_and_shows_history(tmp_path, stack, repo):
    name = _name()
    publish(RunContext(repo.uri, "", s3=stack.s3), folder=mlp_folder(tmp_path, name))
    repo.record(name, "gate", 1, "run-x", verdict="fail")
    env = {**os.environ, **stack.s3.env(), "COLUMNS": "200"}
    ls = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "repo", "ls", "-r", repo.uri],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ls.returncode == 0, ls.stderr
    row = next(line for line in ls.stdout.splitlines() if name in line)
    assert "│ -" in row and "│ 1 " in row
    history = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "repo", "history", name, "-r", repo.uri],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert history.returncode == 0, history.stderr
    lines = history.stdout.splitlines()
    published = next(i for i, line in enumerate(lines) if "published" in line)
    gate = next(i for i, line in enumerate(lines) if "gate" in line and "verdict" in line)
    assert published < gate
    assert json.loads(json.dumps(repo.history(name)[-1]))["verdict"] == "fail"


def test_release_lease_lets_one_release_of_a_model_proceed_and_expires(stack):
    """The lease part of the repository on its own (components/repository/leases.py)."""
    repo = Leases(f"s3://{stack.bucket}", stack.s3)
    name, other = _name(), _name()
    repo.acquire_lease(name, "run-a")
    with pytest.raises(LeaseHeld, match=rf"'{name}' is being released by run run-a .*wait for it to finish"):
        repo.acquire_lease(name, "run-b")
    repo.acquire_lease(name, "run-a")  # the holder renews
    repo.acquire_lease(other, "run-b")  # another model is released in parallel
    assert not repo.release_lease(name, "run-b")  # only the holder gives it back
    assert repo.release_lease(name, "run-a")
    repo.acquire_lease(name, "run-b", seconds=-1)  # run-b died and its lease has expired
    repo.acquire_lease(name, "run-c")  # taken over
    with pytest.raises(LeaseHeld, match="run-c"):
        repo.acquire_lease(name, "run-b")


def test_racing_runs_get_the_lease_exactly_once(stack):
    repo = Leases(f"s3://{stack.bucket}", stack.s3)
    name = _name()
    winners, losers = [], []

    def take(owner: str) -> None:
        try:
            repo.acquire_lease(name, owner)
            winners.append(owner)
        except LeaseHeld:
            losers.append(owner)

    threads = [threading.Thread(target=take, args=(f"run-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == 5


def test_version_numbers_on_their_own_are_contiguous_claimed_once_and_resumable(stack):
    """The allocation part of the repository on its own (components/repository/versions.py)."""
    versions = Versions(f"s3://{stack.bucket}/alloc-{uuid.uuid4().hex[:6]}", stack.s3)
    name = _name()
    taken = [versions.allocate_version(name, {"run_id": f"r{i}"}) for i in range(3)]
    assert taken == [1, 2, 3] and sorted(versions.allocated_versions(name)) == [1, 2, 3]
    member = _name()
    versions.claim_version(member, 3, {"run_id": "ens", "digest": "d1"})
    versions.claim_version(member, 3, {"run_id": "ens", "digest": "d1"})  # the same release resumes its claim
    with pytest.raises(RepositoryError, match="already taken by another release"):
        versions.claim_version(member, 3, {"run_id": "other", "digest": "d2"})
    assert versions.allocation(member, 3) == {"run_id": "ens", "digest": "d1"}
    assert versions.allocate_version(member, {"run_id": "next"}) == 4
