"""Manifests and transfer: a version's files, then its manifest last (a version without one does not exist);
verification, download, and the server-side copy of a staged candidate into production."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from components.repository.store import (
    MANIFEST,
    PRODUCTION,
    STAGING,
    TRANSFER,
    RepositoryError,
    Store,
    VersionConflict,
    candidate_name,
    sha256_file,
)
from components.s3 import S3_EXCEPTIONS, explain


@dataclass(frozen=True)
class Manifest:
    model: str
    version: int
    files: dict[str, dict[str, Any]]  # relative path -> {"sha256", "size"}
    digest: str  # over the files: identifies the content
    run_id: str
    created: str
    signature: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    golden: str = "golden.npz"
    members: dict[str, int] = field(default_factory=dict)  # an ensemble's member models and their versions
    ensemble: str = ""  # a member's ensemble (members are released only with it)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        return cls(**json.loads(text))


def content_digest(files: dict[str, dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(f"{rel}\0{files[rel]['sha256']}\0{files[rel]['size']}\n".encode())
    return digest.hexdigest()


class Manifests(Store):
    def manifest(self, model: str, version: int, staged: bool) -> Manifest | None:
        body = self._get(self.version_prefix(model, version, staged) + MANIFEST)
        return Manifest.from_json(body) if body else None

    def versions(self, model: str, staged: bool) -> list[int]:
        """Complete versions (with a manifest), in order."""
        folder = self._key(STAGING, candidate_name(model)) if staged else self._key(PRODUCTION, model)
        found = []
        for child in self._children(folder + "/"):
            if child.isdigit() and self._exists(f"{folder}/{child}/{MANIFEST}"):
                found.append(int(child))
        return sorted(found)

    def upload_version(self, files: dict[str, Path], manifest: Manifest, staged: bool = True) -> None:
        """Upload `files` (version-relative name -> local path), then the manifest: the version exists only
        after that last write."""
        prefix = self.version_prefix(manifest.model, manifest.version, staged)

        def upload(item: tuple[str, Path]) -> None:
            rel, path = item
            self._call(f"upload {rel}", self.s3.upload_file, str(path), self.bucket, prefix + rel, Config=TRANSFER)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(upload, sorted(files.items())))
        try:
            self._put_new(prefix + MANIFEST, manifest.to_json().encode())
        except VersionConflict:
            existing = self.manifest(manifest.model, manifest.version, staged)
            if existing is None or existing.digest != manifest.digest:
                raise RepositoryError(
                    f"version {manifest.version} of '{manifest.model}' was completed by another writer with other content."
                ) from None

    def verify(self, model: str, version: int, staged: bool) -> list[str]:
        """Re-download every file of a version and compare with its manifest; returns the problems."""
        manifest = self.manifest(model, version, staged)
        if manifest is None:
            return [f"{model} v{version}: no manifest (incomplete version)"]
        prefix = self.version_prefix(model, version, staged)
        problems = []
        for rel, meta in sorted(manifest.files.items()):
            digest, size = hashlib.sha256(), 0
            try:
                body = self.s3.get_object(Bucket=self.bucket, Key=prefix + rel)["Body"]
                for chunk in iter(lambda body=body: body.read(1 << 20), b""):
                    digest.update(chunk)
                    size += len(chunk)
            except S3_EXCEPTIONS as exc:
                if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    problems.append(f"{model} v{version}: {rel} is missing")
                    continue
                raise explain(exc, f"read {prefix + rel}", self.bucket) from None
            if size != meta["size"] or digest.hexdigest() != meta["sha256"]:
                problems.append(f"{model} v{version}: {rel} does not match its manifest (sha256 or size differ)")
        return problems

    def download_version(self, model: str, version: int, staged: bool, dest: Path) -> Manifest:
        manifest = self.manifest(model, version, staged)
        if manifest is None:
            raise RepositoryError(f"version {version} of '{model}' does not exist (no manifest).")
        prefix = self.version_prefix(model, version, staged)
        for rel in manifest.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            self._call(
                f"download {rel}", self.s3.download_file, self.bucket, prefix + rel, str(dest / rel), Config=TRANSFER
            )
            if sha256_file(dest / rel) != manifest.files[rel]["sha256"]:
                raise RepositoryError(f"{prefix + rel} does not match its manifest; run `tritonship repo verify`.")
        return manifest

    def read_version_file(self, model: str, version: int, staged: bool, rel: str) -> bytes:
        body = self._get(self.version_prefix(model, version, staged) + rel)
        if body is None:
            raise RepositoryError(f"{model} v{version} has no {rel}.")
        return body

    # -------------------------------------------------------------------- promotion support
    def copy_to_production(self, model: str, version: int) -> Manifest:
        """Server-side copy of a staged candidate into the production folder, manifest re-verified, manifest last."""
        problems = self.verify(model, version, staged=True)
        if problems:
            raise RepositoryError(f"the staged candidate fails verification: {'; '.join(problems)}.")
        manifest = self.manifest(model, version, staged=True)
        assert manifest is not None
        source, target = self.version_prefix(model, version, True), self.version_prefix(model, version, False)
        existing = self.manifest(model, version, staged=False)
        if existing is not None:
            if existing.digest != manifest.digest:
                raise RepositoryError(f"production already has a different version {version} of '{model}'.")
            return existing
        for rel in manifest.files:
            self._call(
                f"copy {rel}",
                self.s3.copy,
                {"Bucket": self.bucket, "Key": source + rel},
                self.bucket,
                target + rel,
                Config=TRANSFER,
            )
        self._put_new(target + MANIFEST, manifest.to_json().encode())
        return manifest
