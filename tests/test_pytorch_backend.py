"""What production's Triton runs, here: every model folder is served by Triton's PyTorch backend (built by
setup from Triton's r24.10 sources), and what that backend refuses or crashes on reaches the user."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from components.errors import TritonshipError
from components.model import model_config
from components.model.model_folder import SIGNATURE_FILE
from components.model.signature import Signature
from components.release.gate.gate import gate
from components.release.promote.promote import reject
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import candidate_name
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from tests.models import MLP, MLP_SIGNATURE, mlp_folder
from tests.release_helpers import TEST_GATE, install_stable, repository, unique

X = {"x": np.ones((1, 16), np.float32)}


def _folder(tmp_path: Path, name: str, sub: str, **kwargs) -> Path:
    (tmp_path / sub).mkdir()
    return mlp_folder(tmp_path / sub, name, **kwargs)


def _edit_config(folder: Path, edit) -> None:
    path = folder / "config.pbtxt"
    config = model_config.parse_pbtxt(path.read_text())
    edit(config)
    path.write_text(model_config.to_pbtxt(config))


def test_the_server_serves_the_folder_with_the_pytorch_backend_and_its_thread_setting(tmp_path, stack):
    name = unique("pt")
    install_stable(stack, _folder(tmp_path, name, "v1"))
    for server in stack.replicas:
        with TritonAdmin(server.http_url) as admin:
            served = admin.model_config(name)
            assert (served["platform"], served["backend"]) == ("pytorch_libtorch", "pytorch")
            assert served["parameters"]["INTRA_OP_THREAD_COUNT"]["string_value"] == "1"
            assert admin.served_version(name, X, ["y"]) == 1


def _state_dict_instead_of_torchscript(folder: Path) -> str:
    torch.save(MLP().state_dict(), folder / "1" / "model.pt")  # a checkpoint, not a TorchScript file
    return "constants.pkl"


def _one_input_too_many(folder: Path) -> str:
    """The config and the signature agree on two inputs; the TorchScript takes one."""
    wrong = {**MLP_SIGNATURE, "inputs": [*MLP_SIGNATURE["inputs"], {"name": "z", "dtype": "fp32", "shape": [-1, 16]}]}
    Signature.from_dict(wrong).save(folder / "1" / SIGNATURE_FILE)
    golden = np.load(folder / "1" / "golden.npz")
    np.savez(folder / "1" / "golden.npz", **dict(golden), **{"in:z": golden["in:x"]})

    def add_input(config):
        config.input.add(name="z", data_type=model_config.mc.DataType.Value("TYPE_FP32")).dims.extend([16])

    _edit_config(folder, add_input)
    return "expects 2 inputs, model provides 1"


@pytest.mark.parametrize("break_it", [_state_dict_instead_of_torchscript, _one_input_too_many])
def test_a_folder_the_backend_refuses_stops_stage_with_its_reason_and_stable_keeps_serving(break_it, tmp_path, stack):
    name = unique("refused")
    install_stable(stack, _folder(tmp_path, name, "v1"))
    folder = _folder(tmp_path, name, "v2", seed=3)
    words = break_it(folder)
    version = publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder).version
    staged = stage(RunContext(repository(stack), name, version, stack.gate.replica, stack.s3))
    assert not staged.accuracy_passed
    assert words in staged.load_error and "\n" not in staged.load_error, staged.load_error
    assert staged.load_error.startswith(f"Triton at {stack.gate.http_url} refused to load {candidate_name(name)}: ")
    context = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3)
    verdict = gate(context, TEST_GATE, staged)
    assert verdict.verdict == "fail" and words in verdict.reasons[0]
    reject(RunContext(repository(stack), name, version, stack.gate.replica, stack.s3), verdict.verdict, verdict.reasons)
    for server in stack.replicas:
        assert TritonAdmin(server.http_url).served_version(name, X, ["y"]) == 1


def _with_inter_op(config) -> None:
    config.parameters[model_config.INTER_OP_PARAMETER].string_value = "1"


def test_publish_refuses_the_inter_op_setting_that_aborts_the_server(tmp_path, stack):
    folder = _folder(tmp_path, unique("interop"), "v1")
    _edit_config(folder, _with_inter_op)
    with pytest.raises(TritonshipError, match="sets INTER_OP_THREAD_COUNT, which makes Triton's PyTorch backend"):
        publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder)


def test_a_candidate_that_takes_the_gate_server_down_fails_and_production_is_untouched(tmp_path, stack, monkeypatch):
    """The real crash of r24.10's backend: the second model in a process that sets INTER_OP_THREAD_COUNT aborts
    the server. Two releases of a folder that sets it, published past publish's check (another tool's)."""
    name = unique("crash")
    install_stable(stack, _folder(tmp_path, name, "v1"))
    stack.restart_triton("gate")  # a server in which no model has set the inter-op threads yet
    monkeypatch.setattr("components.model.model_folder.refuse_server_aborting_parameters", lambda *_a, **_k: None)
    first, second = (_folder(tmp_path, name, sub, seed=seed) for sub, seed in (("v2", 4), ("v3", 5)))
    for folder in (first, second):
        _edit_config(folder, _with_inter_op)
    v2 = publish(RunContext(repository(stack), "", s3=stack.s3), folder=first).version
    staged = stage(RunContext(repository(stack), name, v2, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error  # the first one to set it loads
    reject(RunContext(repository(stack), name, v2, stack.gate.replica, stack.s3), "fail", ["test"])

    v3 = publish(RunContext(repository(stack), "", s3=stack.s3), folder=second).version
    try:
        staged = stage(RunContext(repository(stack), name, v3, stack.gate.replica, stack.s3))
        assert not staged.accuracy_passed and "went down while loading the candidate" in staged.load_error
        assert not stack.gate.process.alive()
        context = RunContext(repository(stack), name, v3, Replica("gate", stack.gate.http_url), stack.s3)
        verdict = gate(context, TEST_GATE, staged)
        assert verdict.verdict == "fail" and "went down" in verdict.reasons[0]
        reject(RunContext(repository(stack), name, v3, stack.gate.replica, stack.s3), verdict.verdict, verdict.reasons)
        for server in stack.replicas:
            assert TritonAdmin(server.http_url).served_version(name, X, ["y"]) == 1
    finally:
        stack.restart_triton("gate")  # as the chart's pod restarts: the gate serves again
    assert stack.gate.ready()
