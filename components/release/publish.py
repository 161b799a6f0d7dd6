"""Publish step: a compiled model folder becomes an immutable, manifest-sealed version in the S3 staging
area, where only the gate server can see it.

Re-running a publish of the same content with the same run id resumes the version it allocated
(an interrupted publish ends in one complete version); other runs always get a new number.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_folder
from components.model.model_config import AOTI_PLATFORM, to_pbtxt, validate_model_name
from components.release.run_context import RunContext
from components.repository import Manifest, ModelRepository, content_digest, sha256_file, utc_now
from components.settings import SERVING_TORCH
from components.settings_model import StepSettings, setting, step_settings

LOG = log.get("publish")
RESUME_WINDOW = 20  # how many recent allocations a re-run looks through for its own


@step_settings("publish")
class PublishSettings(StepSettings):
    """publish's: the serving image's torch, which a torch_aoti package must have been compiled with."""

    serving_torch: Annotated[
        str,
        setting(
            "the serving image's torch; a torch_aoti package compiled with another is refused",
            envvar="TRITONSHIP_SERVING_TORCH",
            expect="a torch version such as 2.14.0",
            pattern=r"^\d+\.\d+(\.\d+)?([+.\w-]*)$",
        ),
    ] = SERVING_TORCH


@dataclass(frozen=True)
class PublishResult:
    model: str
    version: int
    uri: str
    digest: str
    run_id: str
    resumed: bool


def version_files(folder: model_folder.ModelFolder) -> dict[str, Path]:
    """What goes into the version directory: the version's files plus its own config.pbtxt."""
    files = {p.name: p for p in sorted(folder.version_dir.iterdir()) if p.is_file()}
    files[model_folder.CONFIG_FILE] = folder.path / model_folder.CONFIG_FILE
    return files


class PublishError(TritonshipError):
    """A folder that production's servers could not load as it is."""


def check_serving_torch(folder: model_folder.ModelFolder, serving_torch: str) -> None:
    """Refuse an AOTInductor package built with another torch than the serving image's: its generated code
    calls that torch's C++ ABI, and the server would refuse it at load, or worse, on the first request."""
    if folder.config.platform != AOTI_PLATFORM:
        return
    built = str(folder.fingerprint().get("torch") or "unknown")
    if _release(built) != _release(serving_torch):
        raise PublishError(
            f"{folder.path.name}'s model.pt2 was compiled with torch {built}, but the serving image runs torch "
            f"{serving_torch} (images/versions.yaml); compile it with torch {_release(serving_torch)}, in the "
            "compile image of the serving release."
        )


def _release(version: str) -> str:
    """2.13.0 of 2.13.0+cpu: the local part names the build (CPU, CUDA), which the device kind already records."""
    return version.split("+", 1)[0]


def default_run_id(digest: str) -> str:
    return os.environ.get("KFP_RUN_ID") or os.environ.get("TRITONSHIP_RUN_ID") or f"manual-{digest[:12]}"


def _model_of(context: RunContext, model: str) -> str:
    """The folder's model, which the context may name too (or leave ""); refused where the two differ."""
    if context.model and context.model != model:
        raise PublishError(
            f"the folder holds the model '{model}', not '{context.model}'; publish the folder of '{context.model}', "
            "or name no model: publish takes it from the folder."
        )
    return validate_model_name(model)


def publish(context: RunContext, settings: PublishSettings | None = None, *, folder: Path) -> PublishResult:
    """Upload the model folder (or an ensemble bundle) as a new sealed version in the context's repository; its
    model is the folder's (the context's model is "" or the same). The context's run id ("": KFP_RUN_ID, else
    from the content) lets a re-run resume its version. A torch_aoti package must have been compiled with
    `settings.serving_torch`, the serving image's torch."""
    settings = settings or PublishSettings()
    if ensemble.is_bundle(folder):
        return publish_bundle(context, settings, bundle_path=folder)
    compiled = model_folder.read(folder)  # refuses incomplete folders and configs that disagree with the signature
    check_serving_torch(compiled, settings.serving_torch)
    model = _model_of(context, compiled.config.name)
    files = version_files(compiled)
    entries = {rel: {"sha256": sha256_file(path), "size": path.stat().st_size} for rel, path in files.items()}
    digest = content_digest(entries)
    run_id = context.run_id or default_run_id(digest)
    repo = context.repo()
    repo.check_access()

    version, resumed = _resume(repo, model, digest, run_id)
    if version is not None and repo.manifest(model, version, staged=True) is not None:
        uri = repo.version_uri(model, version, True)
        if not any(e["event"] == "published" and e["version"] == version for e in repo.history(model)):
            # the previous attempt sealed the version but died before its history event
            repo.record(model, "published", version, run_id, digest=digest, uri=uri, files=len(entries))
        log.event(LOG, "already published", model=model, version=version, run_id=run_id)
        return PublishResult(model, version, uri, digest, run_id, True)
    if version is None:
        version = repo.allocate_version(model, {"digest": digest, "run_id": run_id, "created": utc_now()})
    manifest = Manifest(
        model=model,
        version=version,
        files=entries,
        digest=digest,
        run_id=run_id,
        created=utc_now(),
        signature=compiled.signature.to_dict(),
        fingerprint=compiled.fingerprint(),
    )
    repo.upload_version(files, manifest, staged=True)
    uri = repo.version_uri(model, version, True)
    repo.record(model, "published", version, run_id, digest=digest, uri=uri, files=len(entries))
    log.event(LOG, "published", model=model, version=version, uri=uri, resumed=resumed)
    return PublishResult(model, version, uri, digest, run_id, resumed)


def _resume(repo: ModelRepository, model: str, digest: str, run_id: str) -> tuple[int | None, bool]:
    """The version this run already allocated for this content, if any."""
    for version in sorted(repo.allocated_versions(model), reverse=True)[:RESUME_WINDOW]:
        owner = repo.allocation(model, version) or {}
        if owner.get("digest") == digest and owner.get("run_id") == run_id:
            return version, True
    return None, False


def publish_bundle(context: RunContext, settings: PublishSettings | None = None, *, bundle_path: Path) -> PublishResult:
    """An ensemble release: every member becomes version N of its own name, then the ensemble (its config
    pinned to N) seals the release with its manifest, written last. The context's model is "" or the ensemble's."""
    settings = settings or PublishSettings()
    bundle = ensemble.read_bundle(bundle_path)
    for member in bundle.members:
        check_serving_torch(member, settings.serving_torch)
    _model_of(context, bundle.name)
    for name in (m.config.name for m in bundle.members):
        validate_model_name(name)
    files = {f.config.name: version_files(f) for f in (*bundle.members, bundle.ensemble)}
    entries = {
        name: {rel: {"sha256": sha256_file(p), "size": p.stat().st_size} for rel, p in member_files.items()}
        for name, member_files in files.items()
    }
    digest = content_digest({f"{name}/{rel}": e for name, es in entries.items() for rel, e in es.items()})
    run_id = context.run_id or default_run_id(digest)
    repo = context.repo()
    repo.check_access()
    version, resumed = _resume(repo, bundle.name, digest, run_id)
    if version is not None and repo.manifest(bundle.name, version, staged=True) is not None:
        return PublishResult(bundle.name, version, repo.version_uri(bundle.name, version, True), digest, run_id, True)
    owner = {"digest": digest, "run_id": run_id, "created": utc_now()}
    if version is None:
        version = repo.allocate_version(bundle.name, owner)
    for member in bundle.members:
        name = member.config.name
        repo.claim_version(name, version, owner)
        manifest = Manifest(
            model=name,
            version=version,
            files=entries[name],
            digest=content_digest(entries[name]),
            run_id=run_id,
            created=utc_now(),
            signature=member.signature.to_dict(),
            fingerprint=member.fingerprint(),
            ensemble=bundle.name,
        )
        repo.upload_version(files[name], manifest, staged=True)
    with tempfile.TemporaryDirectory(prefix="tritonship-publish-") as tmp:
        pinned = Path(tmp) / model_folder.CONFIG_FILE
        pinned.write_text(to_pbtxt(ensemble.pin_members(bundle.ensemble.config, version)))
        ensemble_files = {**files[bundle.name], model_folder.CONFIG_FILE: pinned}
        ensemble_entries = {
            **entries[bundle.name],
            model_folder.CONFIG_FILE: {"sha256": sha256_file(pinned), "size": pinned.stat().st_size},
        }
        manifest = Manifest(
            model=bundle.name,
            version=version,
            files=ensemble_entries,
            digest=digest,
            run_id=run_id,
            created=utc_now(),
            signature=bundle.ensemble.signature.to_dict(),
            fingerprint=bundle.ensemble.fingerprint(),
            members={m.config.name: version for m in bundle.members},
        )
        repo.upload_version(ensemble_files, manifest, staged=True)
    uri = repo.version_uri(bundle.name, version, True)
    repo.record(bundle.name, "published", version, run_id, digest=digest, uri=uri, members=manifest.members)
    log.event(LOG, "published", model=bundle.name, version=version, members=len(bundle.members), uri=uri)
    return PublishResult(bundle.name, version, uri, digest, run_id, resumed)
