"""The Triton model folder the compile step writes and the publish step uploads.

    <folder>/config.pbtxt          generated from the signature
    <folder>/1/model.pt            the compiled TorchScript (Triton's PyTorch backend, platform pytorch_libtorch)
    <folder>/1/model.pt2           or the AOTInductor package (the same backend, platform torch_aoti)
    <folder>/1/signature.yaml      the I/O signature
    <folder>/1/golden.npz          golden inputs (in:<name>) and eager fp32 reference outputs (out:<name>)
    <folder>/1/build.json          the build fingerprint (torch, TensorRT, CUDA, GPU, image, parity figures)

Everything about one build lives in the version directory, so a published version is self-describing.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from components.errors import TritonshipError
from components.model.model_config import (
    MODEL_FILES,
    PYTORCH_PLATFORM,
    ModelConfig,
    build,
    check_against,
    parse_pbtxt,
    refuse_server_aborting_parameters,
    to_pbtxt,
)
from components.model.signature import Signature

VERSION_DIR = "1"
MODEL_FILE = "model.pt"
PYTHON_MODEL_FILE = "model.py"  # an ensemble step's (the Python backend's) entry point
SIGNATURE_FILE = "signature.yaml"
GOLDEN_FILE = "golden.npz"
BUILD_FILE = "build.json"
CONFIG_FILE = "config.pbtxt"


class ModelFolderError(TritonshipError):
    """A model folder is incomplete or inconsistent."""


def save_golden(path: Path, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
    arrays = {f"in:{k}": v for k, v in inputs.items()} | {f"out:{k}": v for k, v in outputs.items()}
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_golden(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            inputs = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
            outputs = {k[4:]: data[k] for k in data.files if k.startswith("out:")}
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"the golden samples {path} cannot be read: {exc}.") from None
    return inputs, outputs


def save_checks(path: Path, checks: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> None:
    """Named sets of inputs and reference outputs (keys `<check>/in:<name>`, `<check>/out:<name>`)."""
    arrays = {
        f"{check}/{kind}:{k}": v
        for check, (inputs, outputs) in checks.items()
        for kind, tensors in (("in", inputs), ("out", outputs))
        for k, v in tensors.items()
    }
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_checks(path: Path) -> dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            checks: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}
            for key in data.files:
                check, _, rest = key.rpartition("/")
                kind, _, name = rest.partition(":")
                checks.setdefault(check, ({}, {}))[0 if kind == "in" else 1][name] = data[key]
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"the shape checks {path} cannot be read: {exc}.") from None
    return checks


def write(
    folder: Path,
    name: str,
    signature: Signature,
    model_file: Path,
    golden_inputs: dict[str, np.ndarray],
    golden_outputs: dict[str, np.ndarray],
    fingerprint: dict[str, Any],
    gpu: bool = False,
    platform: str = PYTORCH_PLATFORM,
) -> Path:
    """Write a complete model folder; `folder` must not exist yet (or be empty)."""
    if folder.exists() and any(folder.iterdir()):
        raise ModelFolderError(f"{folder} already exists and is not empty; choose a new output folder.")
    version_dir = folder / VERSION_DIR
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, version_dir / MODEL_FILES[platform])
    signature.save(version_dir / SIGNATURE_FILE)
    save_golden(version_dir / GOLDEN_FILE, golden_inputs, golden_outputs)
    (version_dir / BUILD_FILE).write_text(json.dumps(fingerprint, indent=2, sort_keys=True))
    (folder / CONFIG_FILE).write_text(to_pbtxt(build(name, signature, gpu=gpu, platform=platform)))
    return folder


@dataclass(frozen=True)
class ModelFolder:
    """A model folder read back and checked for completeness."""

    path: Path
    config: ModelConfig
    signature: Signature

    @property
    def version_dir(self) -> Path:
        return self.path / VERSION_DIR

    def files(self) -> list[Path]:
        """Every file to publish, relative to the folder, config.pbtxt included."""
        return sorted(p.relative_to(self.path) for p in self.path.rglob("*") if p.is_file())

    def golden(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return load_golden(self.version_dir / GOLDEN_FILE)

    def fingerprint(self) -> dict[str, Any]:
        return json.loads((self.version_dir / BUILD_FILE).read_text())


def _required_files(config: ModelConfig, version_dir: Path) -> tuple[str, ...]:
    """A compiled model, an ensemble (its golden outputs are the release's reference) or an ensemble's
    pre/post-processing step (step.py; checked through the ensemble)."""
    if config.platform == "ensemble":
        return SIGNATURE_FILE, GOLDEN_FILE, BUILD_FILE
    if (version_dir / "step.py").is_file():
        return SIGNATURE_FILE, BUILD_FILE
    return model_file(config), SIGNATURE_FILE, GOLDEN_FILE, BUILD_FILE


def model_file(config: ModelConfig) -> str:
    """The compiled model's file name in the version directory (model.pt, or model.pt2 for torch_aoti)."""
    return MODEL_FILES.get(config.platform, MODEL_FILE)


def read(folder: Path) -> ModelFolder:
    """Read a model folder and refuse it, with the reason, if anything Triton or we need is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"{folder} is not a folder; pass the output folder of `tritonship compile`.")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise ModelFolderError(f"{folder} has no {CONFIG_FILE}; it is not a Triton model folder.")
    version_dir = folder / VERSION_DIR
    config = parse_pbtxt(config_path.read_text(), str(config_path))
    for required in _required_files(config, version_dir):
        if not (version_dir / required).is_file():
            raise ModelFolderError(f"{folder} has no {VERSION_DIR}/{required}; re-run `tritonship compile`.")
    compiled = version_dir / model_file(config)
    if compiled.is_file() and compiled.stat().st_size == 0:
        raise ModelFolderError(f"{compiled} is empty; re-run `tritonship compile`.")
    if config.backend == "python" and not (version_dir / PYTHON_MODEL_FILE).is_file():
        raise ModelFolderError(f"{folder} uses the python backend but has no {VERSION_DIR}/{PYTHON_MODEL_FILE}.")
    signature = Signature.load(version_dir / SIGNATURE_FILE)
    check_against(config, signature, str(config_path))
    refuse_server_aborting_parameters(config, str(config_path))
    return ModelFolder(folder, config, signature)
