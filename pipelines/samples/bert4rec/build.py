"""Building the BERT4Rec sample's releases through the export and compile steps: a model folder, the
ensemble's pre/post steps (Python or TorchScript), the ensemble bundle, and the folded form."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import DEMO, HERE, TOP_K, USERS, Size, histories

if TYPE_CHECKING:
    from components.model.ensemble import CompiledStep, Step
    from components.model.settings import CompileSettings


def compiled_folder(
    factory: str,
    signature: dict,
    out: Path,
    settings: CompileSettings | None = None,
    golden: dict[str, np.ndarray] | None = None,
    checkpoint: Path | None = None,
) -> Path:
    """The sample's `factory` (or any "module:function") through the export and compile steps (compiled as
    `settings` say, the defaults' TorchScript for Triton's PyTorch backend unless they say otherwise), with the
    weights of a `checkpoint` (a state_dict) when one is given: the model folder `out`, named as it."""
    from components.model.compile import compile_model
    from components.model.export import export

    with tempfile.TemporaryDirectory(prefix="tritonship-bert4rec-") as tmp:
        work = Path(tmp)
        (work / "signature.json").write_text(json.dumps(signature))
        if golden is not None:
            np.savez(work / "golden.npz", **golden)
        export(
            factory if ":" in factory else f"pipelines.samples.bert4rec:{factory}",
            work / "signature.json",
            work / "export",
            golden=work / "golden.npz" if golden is not None else None,
            checkpoint=str(checkpoint) if checkpoint is not None else None,
        )
        compile_model(work / "export", out, out.name, settings)
    return out


STEP_FACTORIES = {DEMO: ("catalogue_pre", "catalogue_post"), USERS: ("users_catalogue_pre", "users_catalogue_post")}


def ensemble_steps(work: Path, name: str, size: Size = DEMO, compiled: bool = False) -> list[Step | CompiledStep]:
    """The pre and post steps under `work`, reading the catalogue of `size`: step.py folders for the Python
    backend, or `compiled`, CataloguePre and CataloguePost compiled to TorchScript for the PyTorch backend
    (on the CPU: a lookup and a gather, no work for a GPU)."""
    from components.model.ensemble import CompiledStep, Step
    from components.model.signature import Signature

    if compiled:
        rng = np.random.default_rng(7)
        goldens = [
            {"history": histories(16, seed=7, size=size)},
            {
                "topk_indices": rng.integers(0, size.items + 2, size=(16, TOP_K)),
                "topk_scores": rng.random((16, TOP_K), dtype=np.float32),
            },
        ]
        return [
            CompiledStep(
                f"{name}_{role}",
                compiled_folder(factory, size.signatures()[role], work / f"{name}_{role}", golden=golden),
            )
            for role, factory, golden in zip(("pre", "post"), STEP_FACTORIES[size], goldens, strict=True)
        ]
    steps: list[Step | CompiledStep] = []
    for role in ("pre", "post"):
        directory = work / f"{name}_{role}"
        shutil.copytree(HERE / role, directory, ignore=shutil.ignore_patterns("__pycache__"))
        (directory / "item_index.json").write_text(json.dumps({"item_ids": size.catalogue_ids()}))
        steps.append(Step(f"{name}_{role}", directory, Signature.from_dict(size.signatures()[role])))
    return steps


def build_bundle(
    out: Path,
    factory: str = "bert4rec_v1",
    name: str = "bert4rec",
    settings: CompileSettings | None = None,
    compiled_steps: bool = False,
) -> Path:
    """Export (default method) and compile the model (as `settings` say), then assemble the release bundle with
    the pre- and postprocessing steps (Python, or `compiled_steps`: TorchScript). The size is the factory's
    model's."""
    from components.model.ensemble import assemble
    from components.model.signature import Signature

    eager = getattr(bert4rec, factory)()
    size, signatures = eager.size, eager.size.signatures()
    with tempfile.TemporaryDirectory(prefix="tritonship-bert4rec-") as tmp:
        work = Path(tmp)
        model = compiled_folder(factory, signatures["model"], work / f"{name}_model", settings)
        assemble(
            out,
            name,
            Signature.from_dict(signatures["ensemble"]),
            model,
            *ensemble_steps(work, name, size, compiled_steps),
            eager,
            {"history": histories(16, size=size)},
        )
    return out


def build_folded(
    out: Path,
    factory: str = "folded_v1",
    settings: CompileSettings | None = None,
) -> Path:
    """The model with its steps folded in (`WithCatalogue`) through the export and compile steps (as `settings`
    say) as one model folder `out` (named as it), its golden samples real histories; the size is the factory's
    model's."""
    size = getattr(bert4rec, factory)().model.size
    golden = {"history": histories(16, seed=7, size=size)}
    return compiled_folder(factory, size.signatures()["folded"], out, settings, golden)
