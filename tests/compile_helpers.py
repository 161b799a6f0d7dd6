"""Helpers for the export and compile tests: export a sample model, and check Triton serves it like eager."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from components.model import model_folder
from components.model.export import export
from components.model.parity import Tolerance
from components.serving.triton_admin import TritonAdmin
from tests.models import MODELS, upload_folder, write_signature


def export_sample(tmp_path: Path, key: str, **kwargs) -> Path:
    factory, signature = MODELS[key]
    export(factory, write_signature(tmp_path / f"{key}.yaml", signature), tmp_path / f"{key}-export", **kwargs)
    return tmp_path / f"{key}-export"


def assert_served_like_eager(stack, s3, folder: model_folder.ModelFolder, tol: Tolerance, sets=None) -> None:
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
