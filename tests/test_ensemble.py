"""Ensemble releases on the embedded stack: the recommender with its pre/post-processing steps, released,
gated through the ensemble and promoted as one through its canary; a broken id map caught by the accuracy check."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from components.model.ensemble import EnsembleError, ensemble_config, read_bundle, with_serving_settings
from components.model.model_config import ServingSettings
from components.model.model_folder import load_golden
from components.model.settings import CompileSettings
from components.release.gate.gate import gate
from components.release.promote.promote import promote, reject
from components.release.promote.reconcile import reconcile
from components.release.promote.settings import CanarySettings, PromoteSettings
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.release.tune.tune import TuneSettings, default_settings, tune
from components.repository import ModelRepository, candidate_name
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import Thresholds
from pipelines.live_traffic import LiveTraffic
from pipelines.samples import bert4rec, recsys
from pipelines.samples.bert4rec import build as bert4rec_build
from tests.release_helpers import ABSOLUTE_GATE, NO_CANARY, TEST_GATE, replicas, repository, unique

NAME = "recsys"
MEMBERS = ["recsys_pre", "recsys_model", "recsys_post"]
CUDA_FORMS = [pytest.param("cuda", steps, marks=pytest.mark.gpu) for steps in ("python", "torchscript")]
# Measured against the stable ensemble (loaded with its members on the gate) on wide limits: these tests are
# about releasing an ensemble as one; the gate's statistics are measured by benchmarks/gate_quality.py.
THROUGH_THE_STABLE = dataclasses.replace(
    ABSOLUTE_GATE, thresholds=Thresholds(max_p99_regression_pct=50, max_throughput_regression_pct=50)
)
# Short rounds and a far-off limit, as tests/test_canary.py's (which says why): the canary's machinery on an ensemble.
QUICK_CANARY = CanarySettings(round_s=1.0, max_bake_s=20.0, min_requests=20, max_latency_regression_pct=300.0)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    return {
        "v1": recsys.build_bundle(root / "v1", "recommender_v1"),
        "v2": recsys.build_bundle(root / "v2", "recommender_v2"),
        "broken": recsys.build_bundle(root / "broken", "recommender_v2", wrong_id_map=True),
    }


def _golden(bundle: Path) -> tuple[np.ndarray, np.ndarray]:
    inputs, outputs = load_golden(bundle / NAME / "1" / "golden.npz")
    return inputs["history"][:1], outputs["recommended"][:1]


def _release(stack, bundle: Path, settings, run_id: str):
    version = publish(RunContext(repository(stack), "", s3=stack.s3, run_id=run_id), folder=bundle).version
    context = RunContext(repository(stack), NAME, version, stack.gate.replica, stack.s3, run_id)
    staged = stage(context)
    verdict = gate(context, settings, staged)
    return version, staged, verdict


def test_bundle_is_checked_before_anything_is_written(tmp_path, bundles):
    bundle = read_bundle(bundles["v1"])
    assert bundle.name == NAME and [m.config.name for m in bundle.members] == MEMBERS

    shutil.copytree(bundles["v1"], tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "recsys_post")
    with pytest.raises(EnsembleError, match="missing: recsys_post"):
        read_bundle(tmp_path / "b")
    # steps whose tensors do not chain: the model reads item_ids, which pre no longer produces
    pre, model_, post = bundle.members
    renamed = type(pre.config)()
    renamed.CopyFrom(pre.config)
    renamed.output[0].name = "indices"
    with pytest.raises(EnsembleError, match="step 'recsys_model' reads 'item_ids'"):
        ensemble_config(NAME, bundle.ensemble.signature, [renamed, model_.config, post.config])


@pytest.fixture(scope="module")
def first_release(stack, bundles) -> int:
    """The stable ensemble the tests release over: v1, gated on an absolute limit (no stable yet)."""
    version, staged, verdict = _release(stack, bundles["v1"], ABSOLUTE_GATE, "ens-1")
    assert staged.accuracy_passed and verdict.verdict == "pass", verdict.reasons
    context = RunContext(repository(stack), NAME, version, stack.gate.replica, stack.s3, "ens-1")
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    return version


@pytest.mark.slow
def test_ensemble_release_is_promoted_as_one_with_zero_failed_requests(stack, bundles, first_release):
    repo = ModelRepository(repository(stack), stack.s3)
    v1 = first_release

    history, answer_v1 = _golden(bundles["v1"])
    _, answer_v2 = _golden(bundles["v2"])
    assert not np.array_equal(answer_v1, answer_v2)  # the two releases recommend differently
    urls = [s.http_url for s in stack.replicas]
    expected = {v1: {"recommended": answer_v1}, v1 + 1: {"recommended": answer_v2}}
    with LiveTraffic(urls, NAME, {"history": history}, ["recommended"], expected=expected) as client:
        v2, staged, verdict = _release(stack, bundles["v2"], THROUGH_THE_STABLE, "ens-2")
        assert v2 == v1 + 1 and staged.accuracy_passed and verdict.verdict == "pass", verdict.reasons
        assert verdict.stable_version == v1 and verdict.stable.throughput  # measured through the stable ensemble
        context = RunContext(repository(stack), NAME, v2, stack.gate.replica, stack.s3, "ens-2")
        result = promote(context, PromoteSettings(canary=QUICK_CANARY), replicas=replicas(stack), verdict="pass")
    assert client.failures == [], client.failures[:3]
    assert set(client.versions) == {v1, v2}
    assert client.mismatches == []  # every answer is exactly one release's, never a mix

    # the canary: the ensemble's own requests decide; each member's mean latency on both sides is in every round
    assert result.promoted and result.canary.decision == "pass", result.canary.reasons
    counted = [r for r in result.canary.rounds if r.counted]
    assert counted and all(set(r.members) == set(MEMBERS) for r in counted)
    assert all(r.members[m]["canary_mean_ms"] and r.members[m]["baseline_mean_ms"] for r in counted for m in MEMBERS)

    # production: the ensemble pinned to the new members, which alone are loaded and desired
    desired = repo.desired_config(NAME)[0]
    assert [(s.model_name, s.model_version) for s in desired.ensemble_scheduling.step] == [(m, v2) for m in MEMBERS]
    for member in MEMBERS:
        assert repo.desired_config(member)[0].version_policy.specific.versions == [v2]
        for url in urls:
            assert TritonAdmin(url).ready_versions(member) == [v2]
    # the gate holds no candidate and no stable copy any more
    gate_index = set(TritonAdmin(stack.gate.http_url).ready_models())
    assert not gate_index & {NAME, *MEMBERS, candidate_name(NAME), *map(candidate_name, MEMBERS)}

    events = [e for e in repo.history(NAME) if e["run_id"] == "ens-2"]
    assert [e["event"] for e in events] == ["published", "staged", "gate", "promoted"]
    assert events[0]["members"] == events[-1]["members"] == dict.fromkeys(MEMBERS, v2)

    stack.restart_triton("prod-1", load_models=[NAME])  # a new pod: the ensemble and its members from S3
    restarted = TritonAdmin(stack.replicas[1].http_url)
    assert restarted.ready_versions(NAME) == [v2] and all(restarted.ready_versions(m) == [v2] for m in MEMBERS)


@pytest.mark.slow
def test_broken_postprocessing_fails_the_accuracy_check_and_production_keeps_its_ensemble(
    stack, bundles, first_release
):
    repo = ModelRepository(repository(stack), stack.s3)
    desired_before = repo.desired_config(NAME)[0]
    stable = desired_before.version_policy.specific.versions[0]  # v1, or v2 after the promotion test
    version, staged, verdict = _release(stack, bundles["broken"], TEST_GATE, "ens-broken")
    assert not staged.accuracy_passed
    assert [r.name for r in staged.accuracy if not r.passed] == ["recommended"]  # scores are right, ids are not
    assert verdict.verdict == "fail" and "accuracy check failed for output(s) recommended" in verdict.reasons[0]
    context = RunContext(repository(stack), NAME, version, stack.gate.replica, stack.s3, "ens-broken")
    reject(context, verdict.verdict, verdict.reasons)
    history, answer = _golden(bundles["v1" if stable == first_release else "v2"])
    for server in stack.replicas:
        admin = TritonAdmin(server.http_url)
        assert admin.ready_versions(NAME) == [stable]
        np.testing.assert_array_equal(admin.infer(NAME, {"history": history}, ["recommended"])["recommended"], answer)
    assert repo.desired_config(NAME)[0] == desired_before
    gate = TritonAdmin(stack.gate.http_url)
    assert not any(gate.is_ready(candidate_name(n)) for n in [NAME, *MEMBERS])  # members unloaded with it
    events = [e for e in repo.history(NAME) if e["run_id"] == "ens-broken"]
    assert [e["event"] for e in events] == ["published", "staged", "gate", "rejected"]
    assert events[0]["members"] == dict.fromkeys(MEMBERS, version)


@pytest.mark.slow
def test_reconcile_of_the_ensemble_loads_its_members_first(stack, bundles, first_release):
    """A replica restarted without --load-model: reconciling the ensemble alone brings its members back
    (at the versions its steps are pinned to) and then the ensemble."""
    stable = ModelRepository(repository(stack), stack.s3).desired_config(NAME)[0].version_policy.specific.versions[0]
    stack.restart_triton("prod-0")
    states = reconcile(repository(stack), replicas(stack), [NAME], s3=stack.s3)
    assert [(s.replica, s.model) for s in states] == [(r, m) for r in ("prod-0", "prod-1") for m in [*MEMBERS, NAME]]
    assert [s.action for s in states] == ["loaded"] * 4 + ["in sync"] * 4
    restarted = TritonAdmin(stack.replicas[0].http_url)
    assert all(restarted.ready_versions(m) == [stable] for m in [*MEMBERS, NAME])
    history, answer = _golden(bundles["v1" if stable == first_release else "v2"])
    np.testing.assert_array_equal(restarted.infer(NAME, {"history": history}, ["recommended"])["recommended"], answer)


def test_cli_assembles_the_same_bundle_from_its_parts(tmp_path, bundles):
    """`tritonship ensemble` from a compiled folder, two step folders and their signatures: the same
    reference outputs as the sample's own assembly."""
    import subprocess
    import sys

    v1 = bundles["v1"]
    golden_inputs, golden_outputs = load_golden(v1 / NAME / "1" / "golden.npz")
    np.savez(tmp_path / "inputs.npz", **golden_inputs)
    for step in ("pre", "post"):
        shutil.copytree(v1 / f"{NAME}_{step}" / "1", tmp_path / step)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "ensemble",
            str(v1 / f"{NAME}_model"),
            "--name",
            NAME,
            "--signature",
            str(v1 / NAME / "1" / "signature.yaml"),
            "--model",
            "pipelines.samples.recsys:recommender_v1",
            "--pre",
            str(tmp_path / "pre"),
            "--pre-signature",
            str(tmp_path / "pre" / "signature.yaml"),
            "--post",
            str(tmp_path / "post"),
            "--post-signature",
            str(tmp_path / "post" / "signature.yaml"),
            "--inputs",
            str(tmp_path / "inputs.npz"),
            "--out",
            str(tmp_path / "bundle"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert [m.config.name for m in read_bundle(tmp_path / "bundle").members] == MEMBERS
    _, outputs = load_golden(tmp_path / "bundle" / NAME / "1" / "golden.npz")
    for name, expected in golden_outputs.items():
        np.testing.assert_array_equal(outputs[name], expected)


@pytest.mark.slow
@pytest.mark.parametrize("device, steps", [("cpu", "python"), ("cpu", "torchscript"), *CUDA_FORMS])
def test_bert4rec_ensemble_is_staged_tuned_gated_and_promoted(device, steps, tmp_path, stack):
    """The users' model in its production form: catalogue ids -> bert4rec_pre -> BERT4Rec (transformers,
    exported with the default method, compiled on `device`) -> bert4rec_post -> catalogue ids. Staged dark
    on the gate, where its answers must equal the reference computed in Python from the same step code and
    the eager model; tuned (one setting for every member, the pre/post steps with an instance count of their
    own), gated as tuned and promoted with those settings. The steps are Python-backend step.py folders or,
    `torchscript`, compiled like the model and served by the PyTorch backend. The cuda case is the same
    release with the model on a KIND_GPU instance (the lent GPU machine)."""
    name = unique("b4r")
    bundle = bert4rec_build.build_bundle(
        tmp_path / "bundle", name=name, settings=CompileSettings(device=device), compiled_steps=steps == "torchscript"
    )
    repo_uri = repository(stack)
    version = publish(RunContext(repo_uri, "", s3=stack.s3), folder=bundle).version
    staged = stage(RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, "b4r"))
    assert staged.accuracy_passed, staged.accuracy
    assert {r.name for r in staged.accuracy} == {"recommended", "scores"}
    history = bert4rec.histories(3, seed=5)
    answer = TritonAdmin(stack.gate.http_url).infer(candidate_name(name), {"history": history}, ["recommended"])
    assert np.isin(answer["recommended"], bert4rec.CATALOGUE_IDS).all()  # catalogue ids, never a special token

    tuning = tune(
        RunContext(repo_uri, name, version, Replica("gate", stack.gate.http_url), stack.s3, "b4r"),
        TuneSettings(budget=3, instance_counts=(1, 2), load=ABSOLUTE_GATE.load),  # at the gate's load, as in a run
    )
    assert tuning.enabled and len(tuning.trials) >= 3 and all(t.measured for t in tuning.trials), tuning.trials
    members = [f"{name}_pre", f"{name}_model", f"{name}_post"]
    chosen = tuning.chosen
    instances = {m: chosen.instance_count if m.endswith("_model") else chosen.step_instance_count for m in members}
    assert chosen.step_instance_count is not None  # the steps' instances are a knob of their own
    gate_admin = TritonAdmin(stack.gate.http_url)
    for member in members:  # the gate serves every member with the chosen settings, each by its backend
        served = gate_admin.model_config(candidate_name(member))
        assert served["instance_group"][0]["count"] == instances[member]
        python_step = steps == "python" and not member.endswith("_model")
        assert served["backend"] == ("python" if python_step else "pytorch"), served
    context = RunContext(repo_uri, name, version, Replica("gate", stack.gate.http_url), stack.s3, "b4r")
    verdict = gate(context, ABSOLUTE_GATE, staged, tuning=tuning)
    assert verdict.verdict == "pass", verdict.reasons

    context = RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, "b4r")
    promote(context, NO_CANARY, replicas=replicas(stack)[:1], verdict="pass", serving=tuning.chosen)
    repo = ModelRepository(repo_uri, stack.s3)
    production = TritonAdmin(stack.replicas[0].http_url)
    for member in members:
        desired = repo.desired_config(member)[0]
        assert desired.instance_group[0].count == instances[member]
        assert production.ready_versions(member) == [version]
    assert production.infer(name, {"history": history}, ["recommended"])["recommended"].shape == (3, bert4rec.TOP_K)


def test_one_serving_setting_for_every_member_stays_within_what_each_was_built_for(bundles):
    bundle = read_bundle(bundles["v1"])
    members = {m.config.name: m.config for m in bundle.members}
    members["recsys_post"].max_batch_size = 8  # one member built for smaller batches
    wanted = ServingSettings(
        max_batch_size=32, max_queue_delay_us=500, preferred_batch_sizes=(16, 32), instance_count=3
    )
    entry, tuned = with_serving_settings(bundle.ensemble.config, members, wanted)
    assert tuned["recsys_model"].max_batch_size == 32 and tuned["recsys_post"].max_batch_size == 8
    assert list(tuned["recsys_post"].dynamic_batching.preferred_batch_size) == [8]
    assert all(c.instance_group[0].count == 3 for c in tuned.values())
    assert entry.max_batch_size == 8  # no batch the ensemble takes is too large for a member
    assert bundle.ensemble.config.max_batch_size != 8 and members["recsys_model"].instance_group[0].count == 1

    # the pre/post steps' own instance count (CPU processes) leaves the model's alone
    _, tuned = with_serving_settings(bundle.ensemble.config, members, replace(wanted, step_instance_count=4))
    assert {n: c.instance_group[0].count for n, c in tuned.items()} == {
        "recsys_pre": 4,
        "recsys_model": 3,
        "recsys_post": 4,
    }
    assert tuned["recsys_post"].max_batch_size == 8
    assert default_settings(bundle.ensemble.config, list(members.values())).step_instance_count == 1
