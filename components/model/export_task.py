"""The pipeline's export tasks (pipelines/kfp_model_components.py `export_op`, `export_trained_op`): the model's packages
installed first, the signature from the task's text, then the export step. Both run in the task's `model_image`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from components.model.export import ExportResult, export
from components.model.model_packages import install_model_packages
from components.settings import ExportMethod


def export_in_task(
    model: str,
    signature: str,
    out_dir: Path,
    checkpoint: str | None,
    samples: int,
    method: ExportMethod,
    packages: str,
) -> ExportResult:
    """`export` of `model` (a factory, or a saved model file) against the `signature` text, after installing
    `packages` (model_packages)."""
    install_model_packages(packages)
    with tempfile.TemporaryDirectory(prefix="tritonship-signature-") as tmp:
        signature_path = Path(tmp) / "signature.yaml"
        signature_path.write_text(signature)
        return export(model, signature_path, out_dir, checkpoint=checkpoint, samples=samples, method=method)
