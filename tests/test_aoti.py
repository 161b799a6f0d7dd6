"""The aoti target: AOTInductor packages (model.pt2) served as `torch_aoti` by Triton's PyTorch backend r26.05
(the embedded stack's build with scripts/patches/r26.05/), released through stage, tune, gate and promote like
TorchScript, and refused at publish when compiled with another torch than the serving image's."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from components.model import model_config, model_folder
from components.model.compile import CompileError, compile_model
from components.model.export import export, read_export
from components.model.model_config import ServingSettings
from components.model.parity import Tolerance
from components.model.settings import CompileSettings, ExportSettings
from components.release.gate.gate import gate
from components.release.promote.promote import promote
from components.release.publish import PublishError, PublishSettings, publish
from components.release.run_context import RunContext
from components.release.stage import read_candidate, stage
from components.release.tune.settings import TuneSettings
from components.release.tune.tune import tune
from components.repository import ModelRepository
from components.serving import perf
from components.serving.replicas import Replica
from components.serving.triton_admin import AOTI_BACKEND_ENV, TritonAdmin, for_server
from components.settings import RELAXED_STABILITY_PCT, LoadSettings
from pipelines.samples import bert4rec
from tests.models import CNN_SIGNATURE, MODELS, write_signature
from tests.release_helpers import ABSOLUTE_GATE, NO_CANARY, replicas, repository, unique, wait_for

COMPUTE_PARTS = ("compute_input", "compute_infer", "compute_output")
SERVED = Tolerance(atol=1e-4, rtol=1e-4, int_mismatch=0.0)
AOTI_MODELS = {
    "cnn": MODELS["cnn"],
    "bert4rec": ("pipelines.samples.bert4rec:bert4rec_v2", bert4rec.DYNAMIC_SIGNATURE),
}


def _aoti_folder(tmp_path: Path, key: str, precision: str = "fp32", device: str = "cpu") -> tuple[Path, Path]:
    factory, signature = AOTI_MODELS[key]
    export_dir = tmp_path / f"{key}-export"
    export(factory, write_signature(tmp_path / f"{key}.yaml", signature), export_dir)
    name = unique(f"aoti_{key}_")
    compile_model(export_dir, tmp_path / name, name, CompileSettings(target="aoti", precision=precision, device=device))
    return export_dir, tmp_path / name


def _staged_like_eager(stack, folder: model_folder.ModelFolder, export_dir: Path, tol: Tolerance = SERVED):
    """Publish and stage `folder` on the gate; its answers there equal eager's within `tol` at the golden
    inputs and at every shape the export step recorded. Returns the publish result, the stage result and the
    folder as the gate serves it (renamed)."""
    published = publish(
        RunContext(repository(stack), "", s3=stack.s3),
        PublishSettings(serving_torch=stack.serving_torch),
        folder=folder.path,
    )
    staged = stage(RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error
    candidate = model_folder.ModelFolder(
        folder.path, model_config.renamed(folder.config, staged.candidate), folder.signature
    )
    with TritonAdmin(stack.gate.http_url) as admin:
        served = admin.model_config(staged.candidate)
        assert (served["platform"], served["backend"]) == ("torch_aoti", "torchaoti")
        for check, (inputs, reference) in {"golden": folder.golden(), **read_export(export_dir).checks}.items():
            _assert_close(_answers(admin, candidate, inputs), reference, check, tol)
    return published, staged, candidate


def _answers(admin: TritonAdmin, folder: model_folder.ModelFolder, inputs: dict[str, np.ndarray]) -> dict:
    outputs = [s.name for s in folder.signature.outputs]
    return admin.infer_in_batches(folder.config.name, inputs, outputs, folder.config.max_batch_size)


def _single(url: str, folder: model_folder.ModelFolder, inputs: dict[str, np.ndarray], row: int) -> dict:
    with TritonAdmin(url) as admin:
        return _answers(admin, folder, {k: v[row : row + 1] for k, v in inputs.items()})


def _counts(admin: TritonAdmin, model: str) -> tuple[int, int]:
    """Samples inferred and model executions so far."""
    stats = admin.statistics(model)["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def _assert_close(answer: dict, reference: dict, check: str, tol: Tolerance = SERVED) -> None:
    for name, expected in reference.items():
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(answer[name], expected, rtol=tol.rtol, atol=tol.atol, err_msg=check)
        else:
            assert answer[name].shape == expected.shape, check
            assert np.mean(answer[name] != expected) <= tol.int_mismatch, check


# Every package is served like eager and batched; the users' model is then released. The release steps treat
# a package as a model folder whatever its architecture: the other one's release would test nothing new.
@pytest.mark.slow
@pytest.mark.parametrize(("key", "released"), [("cnn", False), ("bert4rec", True)], ids=["cnn", "bert4rec"])
def test_an_aoti_folder_is_served_like_eager_then_tuned_gated_and_promoted(key, released, tmp_path, stack):
    export_dir, path = _aoti_folder(tmp_path, key)
    folder = model_folder.read(path)
    assert (folder.version_dir / "model.pt2").is_file() and not (folder.version_dir / "model.pt").exists()
    assert folder.config.platform == "torch_aoti" and folder.config.default_model_filename == "model.pt2"
    assert not folder.config.backend  # as production's r26.03+ image takes it
    fingerprint = folder.fingerprint()
    assert (fingerprint["target"], fingerprint["torch"], fingerprint["device"]) == ("aoti", torch.__version__, "cpu")
    checked = {row["check"] for row in fingerprint["parity"]}
    assert {"batch 1", f"batch {folder.signature.max_batch_size}"} <= {c.split(",")[0] for c in checked}
    if folder.signature.has_dynamic_dims:  # three batches at the min, the opt and the max of each range
        assert {c.split("(")[-1] for c in checked if "(" in c} == {"min)", "opt)", "max)"} and len(checked) == 10

    published, staged, candidate = _staged_like_eager(stack, folder, export_dir)
    with TritonAdmin(stack.gate.http_url) as admin:
        # single samples sent at once are batched by Triton (the r26.05 responder patch) and answered alike. The
        # queue waits for a batch of 8 up to a second: on a busy machine the clients' requests, sent at once,
        # reached a queue without delay one at a time (64 samples, 64 executions).
        largest = candidate.config.max_batch_size
        patient = ServingSettings(max_queue_delay_us=1_000_000, preferred_batch_sizes=(min(8, largest),))
        admin.load(staged.candidate, model_config.with_settings(candidate.config, patient))
        admin.wait_ready(staged.candidate)
        golden_in, golden_out = folder.golden()
        rows = range(len(next(iter(golden_in.values()))))
        before = _counts(admin, staged.candidate)
        with ThreadPoolExecutor(8) as pool:  # a client each: tritonclient's HTTP client is not thread-safe
            singles = list(pool.map(lambda i: _single(stack.gate.http_url, candidate, golden_in, i), [*rows] * 4))
        for i, answer in zip([*rows] * 4, singles, strict=True):
            _assert_close(answer, {k: v[i : i + 1] for k, v in golden_out.items()}, f"sample {i} batched")
        after = _counts(admin, staged.candidate)
        assert after[1] - before[1] < after[0] - before[0]  # fewer executions than samples
        # each part of the compute inside the request's time (the r26.05 statistics-order patch)
        stats = admin.statistics(staged.candidate)["model_stats"][0]["inference_stats"]
        mean = {part: stats[part]["ns"] / stats[part]["count"] for part in ("success", *COMPUTE_PARTS)}
        assert all(0 < mean[part] < mean["success"] for part in COMPUTE_PARTS), mean
    if not released:
        return

    two_in_flight = TuneSettings(budget=3, load=dataclasses.replace(ABSOLUTE_GATE.load, concurrency=2))
    on_gate = RunContext(
        repository(stack), published.model, published.version, Replica("gate", stack.gate.http_url), stack.s3
    )
    tuned = tune(on_gate, two_in_flight)
    assert tuned.trials and all(t.measured for t in tuned.trials), [t.problem for t in tuned.trials]
    # a package has no TorchScript executor; its instance count is searched like any model's (design.md s. 5)
    assert {t.settings.optimized_execution for t in tuned.trials} == {True}
    assert len({t.settings.instance_count for t in tuned.trials}) > 1, [t.settings for t in tuned.trials]
    on_gate = Replica("gate", stack.gate.http_url)
    context = RunContext(repository(stack), published.model, published.version, on_gate, stack.s3)
    verdict = gate(context, ABSOLUTE_GATE, staged)
    assert verdict.verdict == "pass", verdict.reasons
    context = RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3)
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    for server in stack.replicas:
        with TritonAdmin(server.http_url) as admin:
            _assert_close(_answers(admin, folder, golden_in), golden_out, f"{server.name} after promote")


@pytest.mark.slow
def test_an_aoti_model_changes_its_instance_count_under_traffic_with_no_failed_request(tmp_path, stack):
    """Triton updates instances in place when only their count changes: with clients sending all along, the users'
    BERT4Rec as a package goes from 1 to 2 and 3 instances, no request fails and every answer is eager's. While
    perf_analyzer keeps 6 full batches in flight, Triton's statistics show how many executions run at once: their
    summed durations over the wall time they were summed in. One instance runs one at a time (at most 1); 2 and
    3 run theirs together. (Before patch 7 the first request after adding an instance crashed the server.) What
    each instance's own runner gains in speed is measured by benchmarks/gpu_aoti.py --aoti-instances."""
    export_dir, path = _aoti_folder(tmp_path, "bert4rec")
    folder = model_folder.read(path)
    published, staged, candidate = _staged_like_eager(stack, folder, export_dir)
    golden_in, golden_out = folder.golden()
    rows = len(next(iter(golden_in.values())))
    answered: list[tuple[int, dict]] = []
    failures: list[str] = []
    stop = threading.Event()

    def client(first_row: int) -> None:
        with TritonAdmin(stack.gate.http_url) as admin:  # a client each: tritonclient's is not thread-safe
            for i in itertools.count(first_row):
                if stop.is_set():
                    return
                row = i % rows
                try:
                    answered.append(
                        (row, _answers(admin, candidate, {k: v[row : row + 1] for k, v in golden_in.items()}))
                    )
                except Exception as exc:  # every failure is what the test counts
                    failures.append(f"{type(exc).__name__}: {exc}")

    repo = ModelRepository(repository(stack), stack.s3)
    config = read_candidate(repo, published.model, published.version).candidate_config()
    data = perf.write_input_data(golden_in, tmp_path / "input.json", batched=True)
    # full batches: each execution then outweighs what the server does around it on these 2 cores
    full = folder.config.max_batch_size
    six_in_flight = LoadSettings(concurrency=6, window_ms=1000, batch_size=full, stability_pct=RELAXED_STABILITY_PCT)

    def busy() -> None:
        run = perf.measure(stack.gate.http_url, staged.candidate, data, six_in_flight, str(published.version))
        assert run.ok, f"{run.reason}: {run.stderr_tail}"

    overlap: dict[int, float] = {}
    with ThreadPoolExecutor(4) as pool, TritonAdmin(stack.gate.http_url) as admin:
        clients = [pool.submit(client, first) for first in range(4)]
        try:
            _wait_for_answers(answered, 40)  # traffic on 1 instance before the first change, not a sleep
            overlap[1] = _execution_overlap(admin, staged.candidate, busy)
            for count in (2, 3):
                config.instance_group[0].count = count
                admin.load(staged.candidate, config)
                admin.wait_ready(staged.candidate, published.version)
                assert admin.model_config(staged.candidate)["instance_group"][0]["count"] == count
                _wait_for_answers(answered, 40)
                overlap[count] = _execution_overlap(admin, staged.candidate, busy)
        finally:
            stop.set()
            for running in clients:
                running.result()
    assert failures == [] and _is_live(stack.gate.http_url)
    # executions at once, on average: one instance never more than one, and two and three more than one can
    # explain, with the same allowance for executions cut by the measured span's ends (measured: 0.78, 1.31 and 1.74
    # on this 2-core machine; 0.76, 1.09 and 1.54 with the whole suite beside it)
    assert overlap[1] <= 1.05 < overlap[2] and overlap[3] > 1.05, overlap
    for row, answer in answered:
        _assert_close(answer, {k: v[row : row + 1] for k, v in golden_out.items()}, f"row {row} under reloads")


def _execution_overlap(admin: TritonAdmin, model: str, during) -> float:
    """Executions in flight on average while `during` runs: the model's summed execution time (Triton's batch
    statistics: one entry per execution, whatever its batch size) over the wall time it was summed in."""

    def executing_ns() -> int:
        stats = admin.statistics(model)["model_stats"][0]
        return sum(int(b["compute_infer"]["ns"]) for b in stats.get("batch_stats", []))

    before, started = executing_ns(), time.monotonic_ns()
    during()
    return (executing_ns() - before) / (time.monotonic_ns() - started)


def _wait_for_answers(answered: list, more: int, timeout_s: float = 60.0) -> None:
    """Until `more` answers have come in since the call (the clients run), within `timeout_s`."""
    target = len(answered) + more
    wait_for(lambda: len(answered) >= target, timeout_s, f"{target} answers from the clients")


def _is_live(url: str) -> bool:
    with TritonAdmin(url) as admin:
        return admin.is_live()


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("key", "precision"), [("cnn", "fp32"), ("cnn", "fp16"), ("cnn", "bf16"), ("bert4rec", "fp16")]
)
def test_a_cuda_aoti_folder_is_served_on_a_gpu_instance_like_eager(key, precision, tmp_path, stack):
    """The GPU sibling of the test above (which covers the rest on the CPU): compiled on CUDA at `precision`,
    the package runs on the gate's KIND_GPU instance and answers like eager within the precision's tolerance at
    every check shape, the answers handed back to the client."""
    export_dir, path = _aoti_folder(tmp_path, key, precision, "cuda")
    folder = model_folder.read(path)
    assert folder.config.instance_group[0].kind == model_config.mc.ModelInstanceGroup.KIND_GPU
    fingerprint = folder.fingerprint()
    assert (fingerprint["device"], fingerprint["precision"], fingerprint["torch"]) == (
        "cuda",
        precision,
        torch.__version__,
    )
    _staged_like_eager(stack, folder, export_dir, Tolerance.for_precision(precision))


def test_a_pt2_compiled_with_another_torch_is_refused_at_publish_and_nothing_is_written(tmp_path, stack):
    name = unique("aoti_torch_")
    folder = _fake_aoti_folder(tmp_path / name, name, torch_version="2.99.0+cu130")
    with pytest.raises(PublishError) as info:
        publish(RunContext(repository(stack), "", s3=stack.s3), PublishSettings(serving_torch="2.14.0"), folder=folder)
    assert str(info.value) == (
        f"{name}'s model.pt2 was compiled with torch 2.99.0+cu130, but the serving image runs torch 2.14.0 "
        "(images/versions.yaml); compile it with torch 2.14.0, in the compile image of the serving release."
    )
    assert not ModelRepository(repository(stack), stack.s3).allocated_versions(name)


def _fake_aoti_folder(path: Path, name: str, torch_version: str) -> Path:
    """A torch_aoti folder whose package is never read: publish decides on build.json before any upload."""
    from components.model.signature import Signature

    signature = Signature.from_dict(CNN_SIGNATURE)
    package = path.parent / "model.pt2"
    package.write_bytes(b"PK\x05\x06" + bytes(18))
    inputs = signature.example_inputs(2)
    outputs = {"logits": np.zeros((2, 10), np.float32)}
    fingerprint = {"target": "aoti", "torch": torch_version, "device": "cuda:0"}
    return model_folder.write(path, name, signature, package, inputs, outputs, fingerprint, platform="torch_aoti")


def test_the_same_torch_with_another_build_tag_is_accepted(tmp_path):
    from components.release.publish import check_serving_torch

    folder = model_folder.read(_fake_aoti_folder(tmp_path / "m", "m", torch_version="2.14.0+cu130"))
    check_serving_torch(folder, "2.14.0")
    with pytest.raises(
        PublishError, match="compiled with torch 2.14.0\\+cu130, but the serving image runs torch 2.15.0"
    ):
        check_serving_torch(folder, "2.15.0")


def test_a_model_that_fell_back_to_torchscript_is_refused_by_the_aoti_target_in_one_sentence(tmp_path):
    factory, signature = MODELS["mlp"]
    export(
        factory, write_signature(tmp_path / "s.yaml", signature), tmp_path / "export", ExportSettings(method="trace")
    )
    with pytest.raises(CompileError) as info:
        compile_model(tmp_path / "export", tmp_path / "out", "m", CompileSettings(target="aoti"))
    assert "the aoti target compiles a torch.export program" in str(info.value)
    assert "--target torchscript" in str(info.value) and not (tmp_path / "out").exists()


def test_a_torch_aoti_config_names_the_embedded_backend_only_where_the_environment_says(monkeypatch):
    config = model_config.ModelConfig(name="m", platform="torch_aoti")
    monkeypatch.delenv(AOTI_BACKEND_ENV, raising=False)
    assert for_server(config) is config  # production: the server picks its own backend for the platform
    monkeypatch.setenv(AOTI_BACKEND_ENV, "torchaoti")
    assert (for_server(config).backend, config.backend) == ("torchaoti", "")
    torchscript = model_config.ModelConfig(name="m", platform="pytorch_libtorch")
    assert for_server(torchscript) is torchscript


class _WithConstant(torch.nn.Module):
    """A plain tensor attribute, which torch.export lifts as a constant that `.to(dtype)` does not convert."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.offset = torch.ones(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x + self.offset)


def test_a_lifted_fp32_constant_is_pointed_at_the_low_precision_with_the_graph():
    """What compile_aoti does before an fp16/bf16 compile, on the CPU: the constant left in fp32 would promote
    the sum back to fp32, and the linear layer would refuse it ("mat1 and mat2 must have the same dtype")."""
    from components.model.trace_retarget import point_graph_at_dtype

    program = torch.export.export(_WithConstant().eval(), (torch.randn(2, 4),))
    x = torch.randn(2, 4, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="same dtype"):
        program.module().to(torch.float16)(x)
    module = program.module()
    assert point_graph_at_dtype(module, torch.float32, torch.float16) == 1
    assert module.to(torch.float16)(x).dtype == torch.float16
