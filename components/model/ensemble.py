"""Ensembles: a compiled model released together with its pre/post-processing steps: Python-backend steps
(step.py), or steps compiled to TorchScript like the model (`CompiledStep`), served by the PyTorch backend.

A release bundle is a folder of Triton model folders released as one version N:

    <bundle>/<ensemble>/config.pbtxt     platform "ensemble": pre -> model -> post, tensors chained by name
    <bundle>/<ensemble>/1/                signature.yaml (what clients send and get), golden.npz, build.json
    <bundle>/<model>/...                  the compiled model folder (tritonship compile)
    <bundle>/<pre>/1/step.py + its files  (model.py: tritonship's step wrapper), and the same for <post>;
                                          or a compiled step's folder, as `tritonship compile` wrote it

Every member is published as version N of its own name, and the ensemble's config pins each step to
model_version N. That pin is what makes a switch atomic: a replica first loads the members' version N
beside the old one, then reloads the ensemble (pinned to N) in one step, then unloads the old members,
so no request ever runs old and new members together.

The golden outputs of the ensemble are computed in plain Python at assembly time, from the same step.py
code (a compiled step: its model.pt, checked against its eager module when it was compiled) and the eager
model: the accuracy check compares what Triton serves through the ensemble with that.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from components.errors import TritonshipError
from components.model import model_folder
from components.model.model_config import ModelConfig, ServingSettings, build, renamed, to_pbtxt, with_settings
from components.model.model_folder import ModelFolder
from components.model.signature import Signature

STEP_FILE = "step.py"
ENSEMBLE_PLATFORM = "ensemble"
ROLE_PARAMETER, STEP_ROLE = "tritonship_role", "step"  # marks a pre/post step's config among the members


class EnsembleError(TritonshipError):
    """A release bundle is incomplete or its steps do not chain."""


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == ENSEMBLE_PLATFORM


def member_names(config: ModelConfig) -> list[str]:
    return [step.model_name for step in config.ensemble_scheduling.step]


def pin_members(config: ModelConfig, version: int, rename: Callable[[str], str] = str) -> ModelConfig:
    """A copy whose steps run `rename(member)` at exactly `version` (-1 in a config means "latest")."""
    pinned = ModelConfig()
    pinned.CopyFrom(config)
    for step in pinned.ensemble_scheduling.step:
        step.model_name = rename(step.model_name)
        step.model_version = version
    return pinned


def is_step(config: ModelConfig) -> bool:
    """A pre- or post-processing step (as opposed to the model) of an ensemble."""
    return ROLE_PARAMETER in config.parameters and config.parameters[ROLE_PARAMETER].string_value == STEP_ROLE


def with_serving_settings(
    config: ModelConfig, members: dict[str, ModelConfig], settings: ServingSettings
) -> tuple[ModelConfig, dict[str, ModelConfig]]:
    """An ensemble served with one set of serving settings: every member takes them (its max_batch_size
    and preferred batch sizes no larger than it was built for; the pre/post steps `step_instance_count`
    instances when it is set), the ensemble's max_batch_size becomes the smallest of its members' (Triton
    refuses an ensemble whose batches a member cannot take)."""
    tuned = {}
    for name, member in members.items():
        own = settings
        if is_step(member) and settings.step_instance_count is not None:
            own = replace(own, instance_count=settings.step_instance_count)
        if member.max_batch_size > 0 and settings.max_batch_size is not None:
            cap = min(settings.max_batch_size, member.max_batch_size)
            own = replace(
                own,
                max_batch_size=cap,
                preferred_batch_sizes=tuple(sorted({min(p, cap) for p in settings.preferred_batch_sizes})),
            )
        tuned[name] = with_settings(member, own)
    entry = ModelConfig()
    entry.CopyFrom(config)
    batching = [m.max_batch_size for m in tuned.values() if m.max_batch_size > 0]
    if entry.max_batch_size > 0 and batching:
        entry.max_batch_size = min(batching)
    return entry, tuned


def pinned_member_version(config: ModelConfig) -> int:
    """The member version an ensemble config runs (every step is pinned to the same release)."""
    versions = {step.model_version for step in config.ensemble_scheduling.step}
    if len(versions) != 1 or -1 in versions:
        raise EnsembleError(f"ensemble '{config.name}' does not pin all its steps to one version: {sorted(versions)}.")
    return versions.pop()


# ------------------------------------------------------------------------------------------ steps
@dataclass(frozen=True)
class Step:
    """A pre- or post-processing step: step.py (load/process) and the files it reads, in `directory`."""

    name: str
    directory: Path
    signature: Signature

    def module(self) -> ModuleType:
        path = self.directory / STEP_FILE
        if not path.is_file():
            raise EnsembleError(f"the step '{self.name}' has no {STEP_FILE} in {self.directory}.")
        spec = importlib.util.spec_from_file_location(f"tritonship_step_{self.name}_{uuid.uuid4().hex}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def runner(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        module = self.module()
        state = module.load(str(self.directory))
        return lambda inputs: module.process(state, inputs)


@dataclass(frozen=True)
class CompiledStep:
    """A pre- or post-processing step compiled to TorchScript (`tritonship compile` of an nn.Module), in
    `folder`: the PyTorch backend serves it like the model, with no Python process to hand requests to."""

    name: str
    folder: Path

    def runner(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        import torch

        compiled = model_folder.read(self.folder)
        device = compiled.fingerprint().get("device", "cpu")
        module = torch.jit.load(str(compiled.version_dir / model_folder.MODEL_FILE), map_location=device)
        signature = compiled.signature

        def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            args = [torch.from_numpy(np.ascontiguousarray(inputs[s.name])).to(device) for s in signature.inputs]
            with torch.inference_mode():
                result = module(*args)
            result = (result,) if isinstance(result, torch.Tensor) else result
            return {s.name: t.cpu().numpy() for s, t in zip(signature.outputs, result, strict=True)}

        return run


def step_at(name: str, path: Path, signature: Path | None = None) -> Step | CompiledStep:
    """The step in `path`: a compiled model folder (it carries its signature), or a folder with step.py and
    the files it reads, whose signature file `signature` gives."""
    if (Path(path) / model_folder.CONFIG_FILE).is_file():
        return CompiledStep(name, Path(path))
    if signature is None:
        raise EnsembleError(f"the step {path} is a step.py folder; give its signature (YAML/JSON) as well.")
    return Step(name, Path(path), Signature.load(signature))


def step_source() -> str:
    return (Path(__file__).parent / "templates" / "python_step_model.py").read_text()


def write_step(step: Step | CompiledStep, folder: Path) -> Path:
    """A Triton model folder for `step`: its files, tritonship's wrapper model.py, signature and config; a
    compiled step's folder as compiled, named after the step."""
    if isinstance(step, CompiledStep):
        shutil.copytree(step.folder, folder)
        config = renamed(model_folder.read(folder).config, step.name)
        config.parameters[ROLE_PARAMETER].string_value = STEP_ROLE
        (folder / model_folder.CONFIG_FILE).write_text(to_pbtxt(config))
        return folder
    version_dir = folder / model_folder.VERSION_DIR
    shutil.copytree(step.directory, version_dir, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (version_dir / model_folder.PYTHON_MODEL_FILE).write_text(step_source())
    step.signature.save(version_dir / model_folder.SIGNATURE_FILE)
    (version_dir / model_folder.BUILD_FILE).write_text(json.dumps({"kind": "step"}, indent=2))
    config = build(step.name, step.signature, python_step=True)
    config.parameters[ROLE_PARAMETER].string_value = STEP_ROLE
    (folder / model_folder.CONFIG_FILE).write_text(to_pbtxt(config))
    return folder


# --------------------------------------------------------------------------------------- ensemble
def ensemble_config(name: str, signature: Signature, members: list[ModelConfig]) -> ModelConfig:
    """Chain `members` in order; every tensor a step reads must be an ensemble input or an earlier output."""
    config = build(name, signature, python_step=True)
    config.ClearField("backend")
    config.ClearField("instance_group")
    config.ClearField("dynamic_batching")
    config.platform = ENSEMBLE_PLATFORM
    produced = {t.name for t in config.input}
    for member in members:
        step = config.ensemble_scheduling.step.add(model_name=member.name, model_version=-1)
        for tensor in member.input:
            if tensor.name not in produced:
                raise EnsembleError(
                    f"step '{member.name}' reads '{tensor.name}', which neither the ensemble's inputs nor an earlier "
                    f"step provide; name the tensors so that each step's inputs are earlier outputs."
                )
            step.input_map[tensor.name] = tensor.name
        for tensor in member.output:
            step.output_map[tensor.name] = tensor.name
            produced.add(tensor.name)
    missing = [t.name for t in config.output if t.name not in produced]
    if missing:
        raise EnsembleError(f"no step of ensemble '{name}' produces its output(s) {', '.join(missing)}.")
    return config


def reference_outputs(
    pre: Step | CompiledStep,
    model: Callable[..., Any],
    model_signature: Signature,
    post: Step | CompiledStep,
    inputs: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The ensemble's answer computed in Python: pre's step.py (or model.pt), the eager model, post's."""
    import torch

    tensors = dict(inputs)
    tensors.update(pre.runner()(tensors))
    with torch.inference_mode():
        result = model(*[torch.from_numpy(np.ascontiguousarray(tensors[s.name])) for s in model_signature.inputs])
    result = (result,) if isinstance(result, torch.Tensor) else result
    tensors.update({s.name: t.numpy() for s, t in zip(model_signature.outputs, result, strict=True)})
    tensors.update(post.runner()(tensors))
    return tensors


def assemble(
    out: Path,
    name: str,
    signature: Signature,
    compiled: Path,
    pre: Step | CompiledStep,
    post: Step | CompiledStep,
    eager: Callable[..., Any],
    golden_inputs: dict[str, np.ndarray],
) -> Path:
    """Write a release bundle: the compiled model folder, the two steps and the ensemble that chains them."""
    if out.exists() and any(out.iterdir()):
        raise EnsembleError(f"{out} already exists and is not empty; choose a new output folder.")
    model = model_folder.read(compiled)
    names = [name, model.config.name, pre.name, post.name]
    if len(set(names)) != len(names):
        raise EnsembleError(f"the ensemble and its members need distinct names, got {names}.")
    shutil.copytree(compiled, out / model.config.name)
    write_step(pre, out / pre.name)
    write_step(post, out / post.name)
    members = [model_folder.read(out / n).config for n in (pre.name, model.config.name, post.name)]
    config = ensemble_config(name, signature, members)
    reference = reference_outputs(pre, eager, model.signature, post, golden_inputs)
    folder = out / name
    version_dir = folder / model_folder.VERSION_DIR
    version_dir.mkdir(parents=True)
    signature.save(version_dir / model_folder.SIGNATURE_FILE)
    model_folder.save_golden(
        version_dir / model_folder.GOLDEN_FILE, golden_inputs, {s.name: reference[s.name] for s in signature.outputs}
    )
    fingerprint = {
        "kind": "ensemble",
        "members": member_names(config),
        "tolerance": model.fingerprint().get("tolerance"),
    }
    (version_dir / model_folder.BUILD_FILE).write_text(json.dumps(fingerprint, indent=2))
    (folder / model_folder.CONFIG_FILE).write_text(to_pbtxt(config))
    return out


# ------------------------------------------------------------------------------------------ bundles
@dataclass(frozen=True)
class Bundle:
    path: Path
    ensemble: ModelFolder
    members: list[ModelFolder]  # in step order

    @property
    def name(self) -> str:
        return self.ensemble.config.name


def is_bundle(path: Path) -> bool:
    """A folder of model folders (and not a model folder itself)."""
    path = Path(path)
    return (
        path.is_dir()
        and not (path / model_folder.CONFIG_FILE).exists()
        and any((p / model_folder.CONFIG_FILE).is_file() for p in path.iterdir() if p.is_dir())
    )


def read_bundle(path: Path) -> Bundle:
    folders = [model_folder.read(p) for p in sorted(Path(path).iterdir()) if p.is_dir()]
    ensembles = [f for f in folders if is_ensemble(f.config)]
    if len(ensembles) != 1:
        raise EnsembleError(f"{path} holds {len(ensembles)} ensemble configs; a release bundle holds exactly one.")
    ensemble = ensembles[0]
    by_name = {f.config.name: f for f in folders}
    wanted = member_names(ensemble.config)
    missing = [n for n in wanted if n not in by_name]
    extra = sorted(set(by_name) - set(wanted) - {ensemble.config.name})
    if missing or extra:
        raise EnsembleError(
            f"{path}: the ensemble '{ensemble.config.name}' runs {wanted}; "
            f"{'missing: ' + ', '.join(missing) if missing else ''}{' ' if missing and extra else ''}"
            f"{'not in the ensemble: ' + ', '.join(extra) if extra else ''}."
        )
    for folder in folders:
        if folder.path.name != folder.config.name:
            raise EnsembleError(f"{folder.path} holds model '{folder.config.name}'; name the folder after the model.")
    return Bundle(Path(path), ensemble, [by_name[n] for n in wanted])
