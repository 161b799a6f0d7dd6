"""Compile for a GPU: Torch-TensorRT's settings and the CUDA TorchScript path, each gpu test with its CPU sibling here."""

from __future__ import annotations

import copy

import pytest
import torch

from components.model import model_config, model_folder, trace_retarget
from components.model.compile import CompileError, GpuServing, compile_model, tensorrt_compile_settings
from components.model.export import read_export
from components.model.parity import Tolerance
from components.model.settings import CompileSettings
from components.model.signature import Signature
from components.settings_model import SettingsError
from tests.compile_helpers import assert_served_like_eager, export_sample
from tests.models import RECOMMENDER_SIGNATURE


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
    export_dir = export_sample(tmp_path, "mlp")
    with pytest.raises(
        CompileError, match=r"Torch-TensorRT \(torch_tensorrt\) is not installed|needs a CUDA GPU"
    ) as info:
        compile_model(export_dir, tmp_path / "out", "trt", CompileSettings(target="tensorrt"))
    assert "compile image" in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("key", ["recommender", "target_index"])  # a fixed length, and one ranged 3..64
def test_tensorrt_compile_on_gpu(key, precision, tmp_path):
    """The GPU sibling of test_tensorrt_builds_one_profile_from_each_dynamic_dimensions_declared_range."""
    pytest.importorskip("torch_tensorrt")
    export_dir = export_sample(tmp_path, key)
    chosen = CompileSettings(target="tensorrt", precision=precision, device="cuda")
    result = compile_model(export_dir, tmp_path / "out", key, chosen)
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
    export_dir = export_sample(tmp_path, key)
    result = compile_model(export_dir, tmp_path / "out", key, CompileSettings(precision=precision, device="cuda"))
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
    chosen = CompileSettings(precision=precision, device="cuda")
    compile_model(export_sample(tmp_path, "cnn"), tmp_path / name, name, chosen)
    folder = model_folder.read(tmp_path / name)
    assert folder.config.instance_group[0].kind == model_config.mc.ModelInstanceGroup.KIND_GPU
    assert_served_like_eager(stack, s3, folder, Tolerance.for_precision(precision))


def test_fp16_is_refused_on_the_cpu():
    """Refused where the compile step's settings are built, before anything is compiled."""
    with pytest.raises(
        SettingsError, match="precision fp16 with target torchscript compiles on CUDA: give device cuda"
    ):
        CompileSettings(precision="fp16")


def test_a_trace_made_on_the_cpu_in_fp32_is_pointed_at_the_compile_device_and_precision(tmp_path):
    """BERT4Rec's trace keeps the CPU and the fp32 it was traced with (torch.arange(device=x.device),
    transformers' mask.to(cpu) and .to(float32)); compiling for a GPU in fp16 rewrites those constants. Here
    the fp16 trace runs on the CPU and must answer like the fp32 one (the cuda case runs in the gpu tests)."""
    trace = read_export(export_sample(tmp_path, "bert4rec")).path / "model.ts"
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
