"""The pipeline's export tasks (pipelines/kfp_model_components.py `export_op`, `export_trained_op`): the model's packages
installed first, the signature from the task's text, then the export step. Both run in the task's `model_image`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from components.model.export import ExportResult, export
from components.model.model_packages import install_model_packages
from components.model.settings import ExportSettings


def export_in_task(
    model: str, signature: str, out_dir: Path, settings: ExportSettings, checkpoint: str | None
) -> ExportResult:
    """`export` of `model` (a factory, or a saved model file) against the `signature` text, as `settings` say,
    after installing their model_packages (model_packages)."""
    install_model_packages(settings.model_packages)
    with tempfile.TemporaryDirectory(prefix="tritonship-signature-") as tmp:
        signature_path = Path(tmp) / "signature.yaml"
        signature_path.write_text(signature)
        return export(model, signature_path, out_dir, settings, checkpoint=checkpoint)
