"""Export and compile: real models, parity against eager, Triton model folders served by the embedded Triton."""

from __future__ import annotations

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

from components.model import model_config, model_folder
from components.model.compile import ParityError, compile_model
from components.model.export import ExportError, export, read_export
from components.model.parity import Tolerance, compare
from components.model.settings import CompileSettings
from components.model.signature import POINTS, Signature, SignatureError
from tests.compile_helpers import assert_served_like_eager, export_sample
from tests.models import (
    DYNAMIC_LENGTH_SIGNATURE,
    MLP,
    MLP_SIGNATURE,
    MODELS,
    RECOMMENDER_SIGNATURE,
    TARGET_INDEX_SIGNATURE,
    write_signature,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("key", sorted(MODELS))
def test_model_exports_compiles_and_triton_answers_like_eager(key, tmp_path, stack, s3):
    """The model family on the default path: served = eager at the golden inputs, batch 1, an odd batch,
    max_batch_size and two lengths of a dynamic dimension."""
    export_dir = export_sample(tmp_path, key)
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
    assert_served_like_eager(stack, s3, folder, Tolerance(atol=1e-5, rtol=1e-4, int_mismatch=0.0), sets)


def test_a_ranged_length_is_staged_tuned_and_gated_at_its_opt(tmp_path, stack):
    """Tune's and the gate's perf_analyzer send the golden inputs, made at every ranged dimension's opt, and
    their reports say so."""
    from components.release.gate.gate import gate
    from components.release.publish import publish
    from components.release.run_context import RunContext
    from components.release.stage import stage
    from components.release.tune.settings import TuneSettings
    from components.release.tune.tune import tune
    from components.serving.replicas import Replica
    from tests.release_helpers import ABSOLUTE_GATE, repository, unique

    name, at_opt = unique("ranged"), {"items": [16], "target_idx": [1]}  # the length at its opt, 16
    compile_model(export_sample(tmp_path, "target_index"), tmp_path / name, name)
    version = publish(RunContext(repository(stack), "", s3=stack.s3), folder=tmp_path / name).version
    staged = stage(RunContext(repository(stack), name, version, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error
    searched = TuneSettings(load=ABSOLUTE_GATE.load, budget=1, instance_counts=(1,), queue_delays_us=(0,))
    tuned = tune(RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3), searched)
    assert tuned.request_shapes == at_opt
    context = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3)
    verdict = gate(context, ABSOLUTE_GATE, staged, tmp_path / "gate")
    assert verdict.verdict == "pass", verdict.reasons
    assert verdict.settings["request_shapes"] == at_opt
    assert "requests of items [16], target_idx [1]" in (tmp_path / "gate" / "report.md").read_text()


def test_compiled_model_that_differs_from_eager_fails_parity_and_writes_nothing(tmp_path):
    export_dir = export_sample(tmp_path, "mlp")
    # Plant a different network (other weights) in place of the exported one.
    other = MLP(seed=1).eval()
    program = torch.export.export(other, (torch.randn(2, 16),))
    torch.export.save(program, str(export_dir / "exported.pt2"))
    torch.jit.trace(other, torch.randn(2, 16)).save(str(export_dir / "model.ts"))
    with pytest.raises(ParityError) as info:
        compile_model(export_dir, tmp_path / "out", "planted")
    message = str(info.value)
    assert "does not match the eager model" in message and "FAIL" in message and "y " in message
    assert "(atol 0.0001, rtol 0.0001, integer mismatch 0%)" in message  # fp32's, as no tolerance was given
    assert not (tmp_path / "out").exists()
    # the settings' tolerances are the ones checked, and recorded
    loose = CompileSettings(atol=1e3, rtol=0.5)
    assert all(r.passed for r in compile_model(export_dir, tmp_path / "out", "planted", loose).parity)
    assert model_folder.read(tmp_path / "out").fingerprint()["tolerance"] == {
        "atol": 1e3,
        "rtol": 0.5,
        "int_mismatch": 0.0,
    }


def test_a_size_fixed_into_the_torchscript_fails_naming_the_shape_and_the_operations_own_message(tmp_path):
    # What tracing the exported program (rather than the eager module) does to a model that reads x.size(0).
    export_dir = export_sample(tmp_path, "size_reshape")
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
    export_dir = export_sample(tmp_path, "mlp", golden=tmp_path / "golden.npz")
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
