"""Export and compile: real models, parity against eager, Triton model folders served by the embedded Triton."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from components.model import model_config, model_folder, trace_retarget
from components.model.compile import CompileError, GpuServing, ParityError, compile_model, tensorrt_compile_settings
from components.model.export import ExportError, export, read_export
from components.model.parity import Tolerance, compare
from components.model.signature import POINTS, Signature, SignatureError
from components.serving.triton_admin import TritonAdmin
from tests.models import (
    DYNAMIC_LENGTH_SIGNATURE,
    MLP,
    MLP_SIGNATURE,
    MODELS,
    RECOMMENDER_SIGNATURE,
    TARGET_INDEX_SIGNATURE,
    upload_folder,
    write_signature,
)

REPO = Path(__file__).resolve().parents[1]


def _export(tmp_path: Path, key: str, **kwargs) -> Path:
    factory, signature = MODELS[key]
    export(factory, write_signature(tmp_path / f"{key}.yaml", signature), tmp_path / f"{key}-export", **kwargs)
    return tmp_path / f"{key}-export"


@pytest.mark.parametrize("key", sorted(MODELS))
def test_model_exports_compiles_and_triton_answers_like_eager(key, tmp_path, stack, s3):
    """The model family on the default path: served = eager at the golden inputs, batch 1, an odd batch,
    max_batch_size and two lengths of a dynamic dimension."""
    export_dir = _export(tmp_path, key)
    info = json.loads((export_dir / "export.json").read_text())
    assert info["method"] == "torch.export" and info["fallback_reason"] is None
    name = f"ec_{key}"
    result = compile_model(export_dir, tmp_path / name, name)
    assert result.parity and all(r.passed for r in result.parity)
    exported = read_export(export_dir)
    checks = {r.check for r in result.parity}
    batches = {f"batch {b}" for b in (1, exported.signature.max_batch_size)}
    assert batches < {c.split(",")[0] for c in checks}  # and an odd batch size
    if exported.signature.has_dynamic_dims:  # each batch at the min, the opt and the max of the lengths
        assert {c.split("(")[-1] for c in checks if "(" in c} == {"min)", "opt)", "max)"}
        assert len(checks) == 3 * 3 + 1

    folder = model_folder.read(tmp_path / name)
    assert (
        folder.config.platform == "pytorch_libtorch" and folder.config.max_batch_size == folder.signature.max_batch_size
    )
    fingerprint = folder.fingerprint()
    assert fingerprint["torch"] == torch.__version__ and fingerprint["target"] == "torchscript"
    declared = Signature.from_dict(MODELS[key][1])
    assert folder.signature == declared  # the signature file inside the version says the same ranges
    for spec, config_input in zip(declared.inputs, folder.config.input, strict=True):
        assert list(config_input.dims) == list(spec.shape[1:])  # a ranged dimension is -1 in Triton's config

    sets = {"golden": folder.golden(), **exported.checks}
    _assert_triton_answers(stack, s3, folder, Tolerance(atol=1e-5, rtol=1e-4, int_mismatch=0.0), sets)


def test_a_ranged_length_is_staged_tuned_and_gated_at_its_opt(tmp_path, stack):
    """Tune's and the gate's perf_analyzer send the golden inputs, made at every ranged dimension's opt, and
    their reports say so."""
    from components.release.gate import gate
    from components.release.publish import publish
    from components.release.stage import stage
    from components.release.step_settings import TuneSettings
    from components.release.tune import tune
    from tests.release_helpers import ABSOLUTE_GATE, repository, unique

    name, at_opt = unique("ranged"), {"items": [16], "target_idx": [1]}  # the length at its opt, 16
    compile_model(_export(tmp_path, "target_index"), tmp_path / name, name)
    version = publish(tmp_path / name, repository(stack), s3=stack.s3).version
    staged = stage(repository(stack), name, version, stack.gate.http_url, s3=stack.s3)
    assert staged.accuracy_passed, staged.load_error
    searched = TuneSettings(load=ABSOLUTE_GATE.load, budget=1, instance_counts=(1,), queue_delays_us=(0,))
    tuned = tune(repository(stack), name, version, stack.gate.http_url, searched, s3=stack.s3)
    assert tuned.request_shapes == at_opt
    verdict = gate(
        repository(stack), name, version, stack.gate.http_url, ABSOLUTE_GATE, staged, tmp_path / "gate", s3=stack.s3
    )
    assert verdict.verdict == "pass", verdict.reasons
    assert verdict.settings["request_shapes"] == at_opt
    assert "requests of items [16], target_idx [1]" in (tmp_path / "gate" / "report.md").read_text()


def _assert_triton_answers(stack, s3, folder: model_folder.ModelFolder, tol: Tolerance, sets=None) -> None:
    """Serve `folder` on a replica of the embedded stack (Triton's PyTorch backend, as the server's own view of
    the config says) and compare its answers with the eager reference outputs of every set of inputs (default:
    the golden samples)."""
    name = folder.config.name
    upload_folder(s3, stack.bucket, folder.path, f"models/{name}")
    outputs = [s.name for s in folder.signature.outputs]
    with TritonAdmin(stack.replicas[1].http_url) as admin:
        admin.load(name)
        try:
            served = admin.model_config(name)
            assert (served["platform"], served["backend"]) == ("pytorch_libtorch", "pytorch")
            answers = {
                check: (admin.infer_in_batches(name, inputs, outputs, folder.config.max_batch_size), reference)
                for check, (inputs, reference) in (sets or {"golden": folder.golden()}).items()
            }
        finally:
            admin.unload(name)
    for check, (answer, reference) in answers.items():
        for spec in folder.signature.outputs:
            if spec.dtype == "fp32":
                np.testing.assert_allclose(
                    answer[spec.name],
                    reference[spec.name],
                    rtol=tol.rtol,
                    atol=tol.atol,
                    err_msg=f"{check}: {spec.name}",
                )
            else:
                assert answer[spec.name].shape == reference[spec.name].shape, check
                assert np.mean(answer[spec.name] != reference[spec.name]) <= tol.int_mismatch, check


def test_compiled_model_that_differs_from_eager_fails_parity_and_writes_nothing(tmp_path):
    export_dir = _export(tmp_path, "mlp")
    # Plant a different network (other weights) in place of the exported one.
    other = MLP(seed=1).eval()
    program = torch.export.export(other, (torch.randn(2, 16),))
    torch.export.save(program, str(export_dir / "exported.pt2"))
    torch.jit.trace(other, torch.randn(2, 16)).save(str(export_dir / "model.ts"))
    with pytest.raises(ParityError) as info:
        compile_model(export_dir, tmp_path / "out", "planted")
    message = str(info.value)
    assert "does not match the eager model" in message and "FAIL" in message and "y " in message
    assert not (tmp_path / "out").exists()


def test_a_size_fixed_into_the_torchscript_fails_naming_the_shape_and_the_operations_own_message(tmp_path):
    # What tracing the exported program (rather than the eager module) does to a model that reads x.size(0).
    export_dir = _export(tmp_path, "size_reshape")
    (export_dir / "model.ts").unlink()
    info = json.loads((export_dir / "export.json").read_text())
    (export_dir / "export.json").write_text(json.dumps({**info, "torchscript": None}))
    with pytest.raises(ParityError) as raised:
        compile_model(export_dir, tmp_path / "out", "baked")
    message = str(raised.value)
    assert message.startswith("the compiled model failed at batch 1 (x [1, 32]): ")
    assert "is invalid for input of size 32" in message  # the operation's own words: the error's last line
    assert "TorchScript interpreter" not in message and "--method script" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s["inputs"][0].update(dtype="int64"), "inputs (x: int64[1, 16])"),
        (lambda s: s["inputs"][0].update(shape=[-1, 4, 4]), "inputs (x: fp32[1, 4, 4])"),
        (lambda s: s["outputs"][0].update(dtype="int32"), "output 'y': dtype is fp32, the signature says int32"),
        (lambda s: s["outputs"][0].update(shape=[-1, 5]), "output 'y': shape is"),
    ],
    ids=["input-dtype", "input-rank", "output-dtype", "output-shape"],
)
def test_bad_signature_fails_naming_the_tensor(change, expected, tmp_path):
    signature = json.loads(json.dumps(MLP_SIGNATURE))
    change(signature)
    with pytest.raises(SignatureError, match=re.escape(expected)):
        export("tests.models:make_mlp", write_signature(tmp_path / "s.yaml", signature), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_input_fails_naming_it(tmp_path):
    signature = json.loads(json.dumps(RECOMMENDER_SIGNATURE))
    signature["inputs"] = signature["inputs"][:1]  # mask_pos left out
    with pytest.raises(SignatureError, match=r"forward\(\) takes \(item_ids, mask_pos\).*missing: mask_pos"):
        export("tests.models:make_recommender", write_signature(tmp_path / "s.yaml", signature), tmp_path / "out")
    swapped = json.loads(json.dumps(RECOMMENDER_SIGNATURE))
    swapped["inputs"].reverse()
    with pytest.raises(SignatureError, match=r"use forward\(\)'s order"):
        export("tests.models:make_recommender", write_signature(tmp_path / "w.yaml", swapped), tmp_path / "out")
    golden = tmp_path / "golden.npz"
    np.savez(golden, item_ids=np.zeros((2, 40), np.int64))
    full = write_signature(tmp_path / "full.yaml", RECOMMENDER_SIGNATURE)
    with pytest.raises(SignatureError, match="missing mask_pos"):
        export("tests.models:make_recommender", full, tmp_path / "out", golden=golden)


def test_a_declared_range_round_trips_and_sets_the_lengths_of_examples_and_ids():
    signature = Signature.from_dict(TARGET_INDEX_SIGNATURE)
    assert Signature.from_dict(signature.to_dict()) == signature
    assert signature.to_dict()["dims"] == {"length": {"min": 3, "opt": 16, "max": 64}}
    for point, length in (("min", 3), ("opt", 16), ("max", 64)):
        example = signature.example_inputs(5, seed=1, dynamic_size=point)
        assert example["items"].shape == (5, length) and example["target_idx"].max() < length
    bare = Signature.from_dict(DYNAMIC_LENGTH_SIGNATURE)  # a -1 without a range: the default one
    assert [bare.example_inputs(1, dynamic_size=p)["sequence"].shape[1] for p in POINTS] == [3, 8, 13]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"inputs": [], "outputs": []}, "'inputs' must be a non-empty list"),
        ({"inputs": [{"name": "x", "dtype": "float", "shape": [-1, 2]}], "outputs": [{}]}, "dtype 'float'"),
        (
            {"inputs": [{"name": "x/../y", "dtype": "fp32", "shape": [-1, 2]}], "outputs": []},
            "name 'x/../y' is not valid",
        ),
        ({"inputs": [{"name": "x", "dtype": "fp32", "shape": [3, 2]}], "outputs": []}, "dimension 0 must be -1"),
        ({"batch": False, "inputs": [{"name": "x", "dtype": "fp32", "shape": [0]}], "outputs": []}, "positive integer"),
    ],
)
def test_signature_file_errors_are_plain(data, expected):
    with pytest.raises(SignatureError, match=expected.replace("(", r"\(")):
        Signature.from_dict(data)


def test_user_golden_samples_are_used(tmp_path):
    inputs = {"x": np.random.default_rng(7).normal(size=(5, 16)).astype(np.float32)}
    np.savez(tmp_path / "golden.npz", **inputs)
    export_dir = _export(tmp_path, "mlp", golden=tmp_path / "golden.npz")
    saved_in, saved_out = model_folder.load_golden(export_dir / "golden.npz")
    np.testing.assert_array_equal(saved_in["x"], inputs["x"])
    with torch.inference_mode():
        np.testing.assert_allclose(saved_out["y"], MLP().eval()(torch.from_numpy(inputs["x"])).numpy(), rtol=1e-6)


def test_checkpoint_state_dict_is_loaded_from_disk_and_s3(tmp_path, stack, s3):
    trained = MLP(seed=42)
    torch.save(trained.state_dict(), tmp_path / "weights.pt")
    s3.upload_file(str(tmp_path / "weights.pt"), stack.bucket, "checkpoints/weights.pt")
    signature = write_signature(tmp_path / "s.yaml", MLP_SIGNATURE)
    for source, out in ((str(tmp_path / "weights.pt"), "a"), (f"s3://{stack.bucket}/checkpoints/weights.pt", "b")):
        export("tests.models:make_mlp", signature, tmp_path / out, checkpoint=source, s3=stack.s3)
        golden_in, golden_out = model_folder.load_golden(tmp_path / out / "golden.npz")
        with torch.inference_mode():
            expected = trained.eval()(torch.from_numpy(golden_in["x"])).numpy()
        np.testing.assert_allclose(golden_out["y"], expected, rtol=1e-6)


class NotAStateDict:
    def __reduce__(self):
        return (print, ("this pickle runs code when loaded without weights_only",))


@pytest.mark.parametrize(
    ("writer", "expected"),
    [
        (lambda p: torch.save(NotAStateDict(), p), r"holds Python objects beside tensors \(.*print\)"),
        (lambda p: torch.save([torch.zeros(1)], p), "is not a state_dict"),
        (lambda p: torch.save({"net.0.weight": torch.zeros(1)}, p), "does not fit the model"),
        (
            lambda p: torch.save({f"encoder.{i}.weight": torch.zeros(1) for i in range(9)}, p),
            r"a state_dict with none of the model's \d+ keys \(it has 9, e.g. 'encoder.0.weight', .*, …\)",
        ),
        (
            lambda p: torch.save({"net.0.weight": torch.zeros(32, 16), "extra": torch.zeros(1)}, p),
            r"\d+ of the model's \d+ keys are missing \(e.g. .*\) and 1 keys are not the model's \(e.g. 'extra'\)",
        ),
        (
            lambda p: p.write_bytes(os.urandom(4096).replace(b"PK", b"pk").lstrip(b"\x80") or b"x"),
            "is not a torch.save file",
        ),
        (
            lambda p: (torch.save({"a": torch.zeros(64)}, p), p.write_bytes(p.read_bytes()[:300])),
            "is a damaged torch.save file",
        ),
    ],
    ids=["untrusted-pickle", "list", "wrong-shape", "another-model", "partly-wrong-keys", "random-bytes", "truncated"],
)
def test_bad_checkpoint_is_refused_clearly(writer, expected, tmp_path):
    writer(tmp_path / "ckpt.pt")
    signature = write_signature(tmp_path / "s.yaml", MLP_SIGNATURE)
    with pytest.raises(ExportError, match=expected) as refused:
        export("tests.models:make_mlp", signature, tmp_path / "out", checkpoint=str(tmp_path / "ckpt.pt"))
    said = str(refused.value)
    assert "weights_only=False" not in said and "\n" not in said and len(said) < 400, said  # one readable sentence
    assert not (tmp_path / "out").exists()


def test_torchscript_and_exported_program_files_are_accepted(tmp_path):
    model = MLP().eval()
    torch.jit.script(model).save(str(tmp_path / "m.ts"))
    batch = {0: torch.export.Dim("batch", max=8)}
    torch.export.save(
        torch.export.export(model, (torch.randn(2, 16),), dynamic_shapes=(batch,)), str(tmp_path / "m.pt2")
    )
    torch.export.save(torch.export.export(model, (torch.randn(2, 16),)), str(tmp_path / "static.pt2"))
    signature = write_signature(tmp_path / "s.yaml", MLP_SIGNATURE)
    with pytest.raises(SignatureError, match=r"Guard failed: x.size\(\)\[0\] == 2"):  # batch fixed at export
        export(str(tmp_path / "static.pt2"), signature, tmp_path / "s")
    assert export(str(tmp_path / "m.ts"), signature, tmp_path / "a").method == "torchscript-file"
    assert export(str(tmp_path / "m.pt2"), signature, tmp_path / "b").method == "torch.export"
    (tmp_path / "truncated.pt").write_bytes((tmp_path / "m.ts").read_bytes()[:100])
    with pytest.raises(ExportError, match="truncated"):
        export(str(tmp_path / "truncated.pt"), signature, tmp_path / "c")


class DataDependent(torch.nn.Module):
    """Control flow on values: torch.export refuses it, TorchScript scripting keeps it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = []
        for i in range(x.shape[0]):
            if x[i].sum() > 0:
                rows.append(x[i] * 2)
            else:
                rows.append(x[i] - 1)
        return torch.stack(rows)


def make_data_dependent() -> torch.nn.Module:
    return DataDependent()


def test_fallback_to_torchscript_is_logged_and_recorded(tmp_path, caplog):
    signature = {
        "batch": True,
        "max_batch_size": 4,
        "inputs": [{"name": "x", "dtype": "fp32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "dtype": "fp32", "shape": [-1, 3]}],
    }
    with caplog.at_level("INFO", logger="tritonship"):
        result = export(
            "tests.test_export_compile:make_data_dependent",
            write_signature(tmp_path / "s.yaml", signature),
            tmp_path / "out",
        )
    assert result.method == "torch.jit.script"
    assert result.fallback_reason and "torch.export failed" in result.fallback_reason
    assert "falling back to TorchScript" in caplog.text
    compiled = compile_model(tmp_path / "out", tmp_path / "folder", "dd")
    assert all(r.passed for r in compiled.parity)


def test_config_pbtxt_round_trips_and_matches_signature():
    signature = Signature.from_dict(RECOMMENDER_SIGNATURE)
    config = model_config.build("rec", signature, gpu=True)
    text = model_config.to_pbtxt(config)
    assert 'platform: "pytorch_libtorch"' in text and "KIND_GPU" in text and "max_batch_size: 32" in text
    parsed = model_config.parse_pbtxt(text)
    assert parsed == config
    assert model_config.to_pbtxt(parsed) == text
    assert [list(t.dims) for t in parsed.input] == [[40], [1]]
    pinned = model_config.pin_version(parsed, 7)
    assert list(pinned.version_policy.specific.versions) == [7] and not parsed.HasField("version_policy")
    assert json.loads(model_config.to_json(pinned))["version_policy"]["specific"]["versions"] == ["7"]
    model_config.check_against(parsed, signature)
    parsed.input[0].dims[0] = 41
    with pytest.raises(model_config.ModelConfigError, match="input 'item_ids' dims are \\[41\\]"):
        model_config.check_against(parsed, signature)
    with pytest.raises(model_config.ModelConfigError, match="not a valid Triton model configuration"):
        model_config.parse_pbtxt('name: "x"\nmax_batch_size: "lots"\n')


@pytest.mark.parametrize("name", ["../etc", "a/b", "", ".hidden", "x\n", "m__candidate", "a..b"])
def test_model_names_are_validated(name):
    with pytest.raises(model_config.ModelConfigError):
        model_config.validate_model_name(name)


def test_tensorrt_settings_follow_the_documented_dynamo_api():
    signature = Signature.from_dict(RECOMMENDER_SIGNATURE)
    settings = tensorrt_compile_settings(signature, "fp16", opt_batch=8, workspace_bytes=1 << 30)
    assert settings["ir"] == "dynamo" and settings["workspace_size"] == 1 << 30
    assert "enabled_precisions" not in settings  # ignored on the dynamo path (docs/design.md section 5)
    assert settings["enable_autocast"] is True and settings["autocast_low_precision_type"] == torch.float16
    item_ids = settings["inputs_spec"][0]
    assert (item_ids["min_shape"], item_ids["opt_shape"], item_ids["max_shape"]) == ((1, 40), (8, 40), (32, 40))
    assert item_ids["dtype"] == torch.int64
    fp32 = tensorrt_compile_settings(signature, "fp32", opt_batch=64, workspace_bytes=1)
    assert "enable_autocast" not in fp32 and fp32["inputs_spec"][1]["opt_shape"] == (32, 1)


def test_tensorrt_builds_one_profile_from_each_dynamic_dimensions_declared_range():
    """The seed's Input(min_shape=[1, 40], opt_shape=[32, 40], max_shape=[64, 40]), with the length ranged too:
    a named dimension shared by two inputs, and a bare -1 at the default range."""
    signature = Signature.from_dict(
        {
            "max_batch_size": 64,
            "dims": {"length": {"min": 8, "opt": 50, "max": 200}},
            "inputs": [
                {"name": "item_ids", "dtype": "int64", "shape": [-1, "length"]},
                {"name": "mask", "dtype": "bool", "shape": [-1, "length"]},
                {"name": "features", "dtype": "fp32", "shape": [-1, -1, 4]},
            ],
            "outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 10]}],
        }
    )
    inputs = tensorrt_compile_settings(signature, "fp16", opt_batch=32, workspace_bytes=1)["inputs_spec"]
    profile = {i["name"]: (i["min_shape"], i["opt_shape"], i["max_shape"]) for i in inputs}
    assert profile["item_ids"] == profile["mask"] == ((1, 8), (32, 50), (64, 200))
    assert profile["features"] == ((1, 3, 4), (32, 8, 4), (64, 13, 4))  # DEFAULT_DIM_RANGE


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA/Torch-TensorRT are missing")
def test_tensorrt_target_without_cuda_or_torch_tensorrt_names_the_missing_piece(tmp_path):
    export_dir = _export(tmp_path, "mlp")
    with pytest.raises(
        CompileError, match=r"Torch-TensorRT \(torch_tensorrt\) is not installed|needs a CUDA GPU"
    ) as info:
        compile_model(export_dir, tmp_path / "out", "trt", target="tensorrt")
    assert "compile image" in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("key", ["recommender", "target_index"])  # a fixed length, and one ranged 3..64
def test_tensorrt_compile_on_gpu(key, precision, tmp_path):
    """The GPU sibling of test_tensorrt_builds_one_profile_from_each_dynamic_dimensions_declared_range."""
    pytest.importorskip("torch_tensorrt")
    export_dir = _export(tmp_path, key)
    result = compile_model(export_dir, tmp_path / "out", key, target="tensorrt", precision=precision, device="cuda")
    assert all(r.passed for r in result.parity)
    if key == "target_index":  # parity held at the profile's min, opt and max length
        assert {c.split("(")[-1] for c in (r.check for r in result.parity) if "(" in c} == {"min)", "opt)", "max)"}
    assert (
        model_folder.read(tmp_path / "out").config.instance_group[0].kind == model_config.mc.ModelInstanceGroup.KIND_GPU
    )


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("key", ["mlp", "cnn", "recommender", "two_heads"])
def test_cuda_torchscript_passes_parity(key, precision, tmp_path):
    """The GPU sibling of test_model_exports_compiles_and_triton_answers_like_eager (CPU)."""
    export_dir = _export(tmp_path, key)
    result = compile_model(export_dir, tmp_path / "out", key, precision=precision, device="cuda")
    assert all(r.passed for r in result.parity)
    folder = model_folder.read(tmp_path / "out")
    assert folder.fingerprint()["gpu"]
    served = torch.jit.load(str(folder.version_dir / model_folder.MODEL_FILE), map_location="cuda")
    outputs = served(*(torch.from_numpy(a).cuda() for a in folder.golden()[0].values()))
    assert [(o.device.type, o.dtype) for o in outputs] == [("cpu", s.torch_dtype) for s in folder.signature.outputs]


def test_the_gpu_serving_wrapper_keeps_the_clients_dtypes_and_answers_on_the_host():
    """The CPU sibling of test_cuda_torchscript_passes_parity's output check: the wrapper compile puts around a
    CUDA model, traced here on the CPU in fp16, takes and gives the signature's dtypes, on the host."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        traced = torch.jit.trace(GpuServing(copy.deepcopy(model), [torch.float32], half=True), (x,))
        (answer,) = traced(x)
        assert answer.device.type == "cpu" and answer.dtype == torch.float32
        torch.testing.assert_close(answer, model(x), rtol=1e-2, atol=1e-2)
    moves = [
        i.node().s("value")
        for n in traced.graph.findAllNodes("aten::to")
        for i in n.inputs()
        if i.type().kind() == "DeviceObjType"
    ]
    assert moves == ["cpu"], "the traced wrapper must move its one output to the host, and only there"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_pytorch_backend_serves_cuda_torchscript_on_a_gpu_instance(precision, tmp_path, stack, s3):
    """The GPU sibling of test_model_exports_compiles_and_triton_answers_like_eager: the embedded
    Triton's PyTorch backend (its GPU build) runs the CUDA model.pt on the GPU its KIND_GPU instance is given."""
    name = f"gpu_cnn_{precision}"
    compile_model(_export(tmp_path, "cnn"), tmp_path / name, name, precision=precision, device="cuda")
    folder = model_folder.read(tmp_path / name)
    assert folder.config.instance_group[0].kind == model_config.mc.ModelInstanceGroup.KIND_GPU
    _assert_triton_answers(stack, s3, folder, Tolerance.for_precision(precision))


def test_fp16_is_refused_on_the_cpu(tmp_path):
    export_dir = _export(tmp_path, "mlp")
    with pytest.raises(CompileError, match="needs a CUDA device"):
        compile_model(export_dir, tmp_path / "out", "m", precision="fp16")


def test_integer_outputs_are_compared_exactly_unless_a_share_is_allowed():
    want = np.arange(20).reshape(2, 10)
    got = want.copy()
    got[0, 0] = 99
    assert not compare("idx", got, want, Tolerance.for_precision("fp32"), "golden").passed
    assert compare("idx", got, want, Tolerance.for_precision("fp16"), "golden").passed  # 5% allowed at fp16
    nan = np.array([1.0, np.nan])
    assert not compare("f", nan, np.array([1.0, 2.0]), Tolerance.for_precision("fp32"), "golden").passed


def test_cli_export_compile_and_bad_input_exit_codes(tmp_path):
    cli = [sys.executable, "-m", "pipelines.cli"]
    signature = write_signature(tmp_path / "s.yaml", MLP_SIGNATURE)
    run = lambda *args: subprocess.run([*cli, *args], capture_output=True, text=True, cwd=REPO, timeout=300)  # noqa: E731
    ok = run("export", "--model", "tests.models:make_mlp", "--signature", str(signature), "--out", str(tmp_path / "e"))
    assert ok.returncode == 0, ok.stderr
    assert "exported with torch.export" in ok.stdout
    ok = run("compile", str(tmp_path / "e"), "--name", "cli_mlp", "--out", str(tmp_path / "f"))
    assert ok.returncode == 0, ok.stderr
    assert "compiled torchscript/fp32 on cpu" in ok.stdout and "ok" in ok.stdout
    assert (tmp_path / "f" / "config.pbtxt").exists()

    bad = json.loads(json.dumps(MLP_SIGNATURE))
    bad["inputs"][0]["dtype"] = "int64"
    failed = run(
        "export",
        "--model",
        "tests.models:make_mlp",
        "--signature",
        str(write_signature(tmp_path / "b.yaml", bad)),
        "--out",
        str(tmp_path / "g"),
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("error:") and "Traceback" not in failed.stderr
    assert not (tmp_path / "g").exists()
    shutil.rmtree(tmp_path / "e")


def test_a_trace_made_on_the_cpu_in_fp32_is_pointed_at_the_compile_device_and_precision(tmp_path):
    """BERT4Rec's trace keeps the CPU and the fp32 it was traced with (torch.arange(device=x.device),
    transformers' mask.to(cpu) and .to(float32)); compiling for a GPU in fp16 rewrites those constants. Here
    the fp16 trace runs on the CPU and must answer like the fp32 one (the cuda case runs in the gpu tests)."""
    trace = read_export(_export(tmp_path, "bert4rec")).path / "model.ts"
    module = torch.jit.load(str(trace)).eval()

    def devices() -> list[str]:
        return [
            node.s("value")
            for graph in trace_retarget._graphs(module)
            for node in graph.findAllNodes("prim::Constant")
            if node.output().type().kind() == "DeviceObjType"
        ]

    assert set(devices()) == {"cpu"}
    assert trace_retarget.point_at_device(module, "cuda:0") == len(devices()) > 0
    assert set(devices()) == {"cuda:0"}

    torch.manual_seed(0)
    half = torch.jit.load(str(trace)).eval()
    assert trace_retarget.point_at_dtype(half, torch.float32, torch.float16) > 0
    floats = {
        node.f("value")
        for graph in trace_retarget._graphs(half)
        for node in graph.findAllNodes("prim::Constant")
        if node.output().type().kind() == "FloatType"
    }
    # the attention mask's fill, fp32's lowest value, would overflow fp16
    assert torch.finfo(torch.float16).min in floats and torch.finfo(torch.float32).min not in floats
    items = torch.randint(1, 500, (4, 40))
    position = torch.full((4, 1), 39)
    indices, scores = half.half()(items, position)
    want_indices, want_scores = torch.jit.load(str(trace)).eval()(items, position)
    assert scores.dtype == torch.float16
    torch.testing.assert_close(scores.float(), want_scores, rtol=2e-2, atol=2e-2)
    assert (indices == want_indices).float().mean() >= 0.9  # fp16 may swap near-ties
