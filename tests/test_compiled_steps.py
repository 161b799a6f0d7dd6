"""Ensemble steps compiled to TorchScript: assembled from compiled model folders by `tritonship ensemble`,
served by the PyTorch backend, answering as the Python steps do. (Their release through stage, tune, gate
and promote: tests/test_ensemble.py, test_bert4rec_ensemble_is_staged_tuned_gated_and_promoted.)"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from components.model import model_folder
from components.model.ensemble import EnsembleError, read_bundle, reference_outputs, step_at
from components.model.signature import Signature
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build


def test_a_step_py_folder_needs_its_signature(tmp_path):
    (python_pre,) = bert4rec_build.ensemble_steps(tmp_path, "b4r")[:1]
    with pytest.raises(EnsembleError, match="is a step.py folder; give its signature"):
        step_at("b4r_pre", python_pre.directory)


def test_the_cli_assembles_an_ensemble_from_compiled_steps(tmp_path):
    """No signatures given for the steps: each compiled folder carries its own. The reference outputs are
    the Python steps' exactly, and the steps are PyTorch-backend members marked as steps."""
    size = bert4rec.DEMO
    signatures = size.signatures()
    model = bert4rec_build.compiled_folder("bert4rec_v1", signatures["model"], tmp_path / "b4r_model")
    pre, post = bert4rec_build.ensemble_steps(tmp_path / "compiled", "b4r", compiled=True)
    Signature.from_dict(signatures["ensemble"]).save(tmp_path / "ensemble.yaml")
    history = bert4rec.histories(8, seed=11)
    history[0, :3] = 7  # no catalogue id: padding
    np.savez(tmp_path / "inputs.npz", history=history)
    command = [sys.executable, "-m", "pipelines.cli", "ensemble", str(model), "--name", "b4r"]
    command += ["--signature", str(tmp_path / "ensemble.yaml"), "--model", "pipelines.samples.bert4rec:bert4rec_v1"]
    command += ["--pre", str(pre.folder), "--post", str(post.folder), "--inputs", str(tmp_path / "inputs.npz")]
    run = subprocess.run([*command, "--out", str(tmp_path / "bundle")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr

    bundle = read_bundle(tmp_path / "bundle")
    assert [m.config.name for m in bundle.members] == ["b4r_pre", "b4r_model", "b4r_post"]
    for member in bundle.members:
        assert member.config.platform == "pytorch_libtorch"
        assert (member.config.parameters["tritonship_role"].string_value == "step") == (
            member.config.name != "b4r_model"
        )
    python_pre, python_post = bert4rec_build.ensemble_steps(tmp_path / "python", "b4r")
    model_signature = Signature.from_dict(signatures["model"])
    expected = reference_outputs(python_pre, bert4rec.bert4rec_v1(), model_signature, python_post, {"history": history})
    _, outputs = model_folder.load_golden(tmp_path / "bundle" / "b4r" / "1" / model_folder.GOLDEN_FILE)
    np.testing.assert_array_equal(outputs["recommended"], expected["recommended"])
    np.testing.assert_array_equal(outputs["scores"], expected["scores"])
    assert (outputs["recommended"][0] != -1).all()  # unknown ids are padding, still ten real items out
