"""The S3 model repository: immutable versions, a manifest written last, staging, history, desired state.

Layout under a repository root `s3://bucket/root` (docs/design.md section 2):

    root/models/<model>/config.pbtxt            desired state: version_policy pinned to the promoted version
    root/models/<model>/<v>/...                 promoted versions (copied from staging), manifest.json last
    root/staging/<model>__candidate/<v>/...     published candidates; only the gate server mounts staging/
    root/versions/<model>/<v>                   allocation markers (conditional writes: one owner per number)
    root/history/<model>/<time>-<id>.json       append-only events, one object each
    root/leases/<model>.json                    the per-model release lease

Production Tritons mount root/models, the gate mounts root/models and root/staging. A version
directory without manifest.json does not exist for readers; `gc` removes it after a grace period.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from components import log
from components.errors import TritonshipError
from components.model_config import CANDIDATE_SUFFIX, ModelConfig, parse_pbtxt, to_pbtxt
from components.s3repo import S3_EXCEPTIONS, S3Error, S3Settings, explain, split_s3_uri

LOG = log.get("repository")
MANIFEST = "manifest.json"
CONFIG = "config.pbtxt"
PRODUCTION = "models"
STAGING = "staging"
# Multipart above 16 MiB in 16 MiB parts, 4 in flight: the fastest multipart setting benchmarks/multipart.py
# measured (as fast as one PUT there); parts keep retries small, and a single PUT stops at 5 GiB.
TRANSFER = TransferConfig(multipart_threshold=16 * 2**20, multipart_chunksize=16 * 2**20, max_concurrency=4)


class RepositoryError(TritonshipError):
    """The repository is missing, inconsistent or refused an operation."""


class VersionConflict(RepositoryError):
    """Someone else wrote the object first (a conditional write failed)."""


class LeaseHeld(RepositoryError):
    """Another run is releasing the same model."""

    exit_code = 3


DEFAULT_LEASE_SECONDS = 3600.0


def lease_owner(run_id: str, model: str, version: int) -> str:
    """Who holds a release: the pipeline run, or (by hand) the model version being released."""
    return run_id or f"manual:{model}:v{version}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def candidate_name(model: str) -> str:
    return f"{model}{CANDIDATE_SUFFIX}"


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


class ModelRepository:
    """One repository root on S3."""

    def __init__(self, uri: str, settings: S3Settings | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.root = split_s3_uri(self.uri)
        self.settings = settings or S3Settings.from_env()
        self.s3 = self.settings.client()
        self._conditional_writes_checked = False

    # ------------------------------------------------------------------------------------ paths
    def _key(self, *parts: str | int) -> str:
        return "/".join(str(p).strip("/") for p in (self.root, *parts) if str(p).strip("/"))

    def production_uri(self) -> str:
        return f"s3://{self.bucket}/{self._key(PRODUCTION)}"

    def staging_uri(self) -> str:
        return f"s3://{self.bucket}/{self._key(STAGING)}"

    def triton_repositories(self, gate: bool = False) -> list[str]:
        """The --model-repository values for a production server (or the gate server)."""
        prefixes = [PRODUCTION, STAGING] if gate else [PRODUCTION]
        return [self.settings.triton_uri(self.bucket, self._key(p)) for p in prefixes]

    def version_uri(self, model: str, version: int, staged: bool) -> str:
        return f"s3://{self.bucket}/{self.version_prefix(model, version, staged)}"

    def version_prefix(self, model: str, version: int, staged: bool) -> str:
        if staged:
            return self._key(STAGING, candidate_name(model), version) + "/"
        return self._key(PRODUCTION, model, version) + "/"

    # ---------------------------------------------------------------------------- S3 wrappers
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except S3_EXCEPTIONS as exc:
            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            ):
                raise VersionConflict(f"{what}: another writer got there first") from None
            raise explain(exc, what, self.bucket) from None

    def check_access(self) -> None:
        """Fail early, with a sentence, if the bucket is missing or access is denied. A listing, not HeadBucket:
        it needs only s3:ListBucket, which every principal of manifests/iam/ has."""
        try:
            self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.root, MaxKeys=1)
        except S3_EXCEPTIONS as exc:
            if isinstance(exc, ClientError):
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 404:
                    raise S3Error(
                        f"the bucket '{self.bucket}' does not exist; create it or fix the repository URI {self.uri}."
                    ) from None
                if status == 403:
                    raise S3Error(
                        f"S3 denied access to bucket '{self.bucket}' (or it does not exist: S3 does not say which to "
                        f"a principal without rights on it); check the repository URI {self.uri}, the credentials and "
                        "their policy."
                    ) from None
            raise explain(exc, "reach the bucket", self.bucket) from None

    def _get(self, key: str) -> bytes | None:
        return self._get_with_etag(key)[0]

    def _get_with_etag(self, key: str) -> tuple[bytes | None, str | None]:
        """The object's bytes and ETag, or (None, None) if it does not exist."""
        try:
            response = self.s3.get_object(Bucket=self.bucket, Key=key)
        except S3_EXCEPTIONS as exc:
            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None, None
            raise explain(exc, f"read s3://{self.bucket}/{key}", self.bucket) from None
        return response["Body"].read(), response["ETag"]

    def _put_new(self, key: str, body: bytes) -> None:
        """Create `key` only if it does not exist (S3 conditional write)."""
        self._call(
            f"create s3://{self.bucket}/{key}",
            self.s3.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=body,
            IfNoneMatch="*",
        )

    def _list(self, prefix: str, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        paginator = self.s3.get_paginator("list_objects_v2")
        kwargs = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        try:
            for page in paginator.paginate(**kwargs):
                yield from page.get("Contents", [])
                for common in page.get("CommonPrefixes", []):
                    yield {"Prefix": common["Prefix"]}
        except S3_EXCEPTIONS as exc:
            raise explain(exc, f"list s3://{self.bucket}/{prefix}", self.bucket) from None

    def _children(self, prefix: str) -> list[str]:
        return [e["Prefix"][len(prefix) :].rstrip("/") for e in self._list(prefix, "/") if "Prefix" in e]

    def _delete_prefix(self, prefix: str) -> int:
        keys = [{"Key": e["Key"]} for e in self._list(prefix) if "Key" in e]
        for start in range(0, len(keys), 1000):
            self._call(
                "delete objects",
                self.s3.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": keys[start : start + 1000]},
            )
        return len(keys)

    # ------------------------------------------------------------------------ version numbers
    def ensure_conditional_writes(self) -> None:
        """Refuse to allocate versions on a server that ignores If-None-Match (it would race)."""
        if self._conditional_writes_checked:
            return
        key = self._key("versions", ".probe", uuid.uuid4().hex)
        self._put_new(key, b"probe")
        try:
            self._put_new(key, b"probe")
        except VersionConflict:
            self._conditional_writes_checked = True
            return
        finally:
            self._call("delete probe", self.s3.delete_object, Bucket=self.bucket, Key=key)
        raise RepositoryError(
            f"the S3 server behind {self.uri} ignores conditional writes (If-None-Match); versions cannot be "
            "allocated safely there. Use an S3 service that supports them (AWS S3 since 2024, MinIO, moto >= 5)."
        )

    def allocated_versions(self, model: str) -> dict[int, dict[str, Any]]:
        prefix = self._key("versions", model) + "/"
        out = {}
        for entry in self._list(prefix):
            name = entry.get("Key", "")[len(prefix) :]
            if name.isdigit():
                out[int(name)] = {"key": entry["Key"], "modified": entry["LastModified"]}
        return out

    def allocate_version(self, model: str, owner: dict[str, Any]) -> int:
        """The next free version number for `model`, claimed with a conditional write."""
        self.ensure_conditional_writes()
        version = max(self.allocated_versions(model), default=0) + 1
        for _ in range(1000):
            try:
                self._put_new(self._key("versions", model, version), json.dumps(owner).encode())
                log.event(LOG, "version allocated", model=model, version=version)
                return version
            except VersionConflict:
                version += 1
        raise RepositoryError(f"could not allocate a version of '{model}' after 1000 attempts.")

    def claim_version(self, model: str, version: int, owner: dict[str, Any]) -> None:
        """Claim exactly `version` of `model` (an ensemble member takes its ensemble's number), or resume
        our own claim; refuse a number someone else holds."""
        try:
            self._put_new(self._key("versions", model, version), json.dumps(owner).encode())
        except VersionConflict:
            current = self.allocation(model, version) or {}
            if (current.get("digest"), current.get("run_id")) != (owner.get("digest"), owner.get("run_id")):
                raise RepositoryError(
                    f"version {version} of '{model}' is already taken by another release ({current.get('run_id')}); "
                    f"'{model}' is an ensemble member and is released only with its ensemble."
                ) from None

    def allocation(self, model: str, version: int) -> dict[str, Any] | None:
        body = self._get(self._key("versions", model, version))
        return json.loads(body) if body else None

    # ----------------------------------------------------------------------------- manifests
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

    def _exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except S3_EXCEPTIONS as exc:
            if isinstance(exc, ClientError) and exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise explain(exc, f"read s3://{self.bucket}/{key}", self.bucket) from None

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

    def desired_config(self, model: str) -> tuple[ModelConfig | None, str | None]:
        """The production config.pbtxt (desired state) and its ETag, or (None, None) before the first release."""
        key = self._key(PRODUCTION, model, CONFIG)
        body, etag = self._get_with_etag(key)
        if body is None:
            return None, None
        return parse_pbtxt(body.decode(), f"s3://{self.bucket}/{key}"), etag

    def write_desired_config(self, model: str, config: ModelConfig, expected_etag: str | None) -> str:
        """Replace config.pbtxt atomically, only if it is still the one read (ETag), or create it if none was."""
        key = self._key(PRODUCTION, model, CONFIG)
        condition = {"IfMatch": expected_etag} if expected_etag else {"IfNoneMatch": "*"}
        response = self._call(
            f"write s3://{self.bucket}/{key}",
            self.s3.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=to_pbtxt(config).encode(),
            **condition,
        )
        return response["ETag"]

    def delete_desired_config(self, model: str) -> None:
        """Back to "never released": production servers will not load the model after a restart."""
        self._call(
            "delete the desired config",
            self.s3.delete_object,
            Bucket=self.bucket,
            Key=self._key(PRODUCTION, model, CONFIG),
        )

    # --------------------------------------------------------------------------- release lease
    def acquire_lease(self, model: str, owner: str, seconds: float = DEFAULT_LEASE_SECONDS) -> dict[str, Any]:
        """Take (or renew) the model's release lease: one release at a time per model.

        Conditional writes make it safe against a concurrent taker: create with If-None-Match, renew
        or take over an expired lease with If-Match on the ETag that was read. A run that died leaves
        a lease that expires and is then taken over.
        """
        key = self._key("leases", f"{model}.json")
        for _attempt in range(5):
            now = time.time()
            body = json.dumps({"owner": owner, "acquired": utc_now(), "expires": now + seconds}).encode()
            current, etag = self._read_lease(key)
            try:
                if current is None:
                    self._put_new(key, body)
                elif current["owner"] == owner or current["expires"] < now:
                    self._call(
                        "renew the lease", self.s3.put_object, Bucket=self.bucket, Key=key, Body=body, IfMatch=etag
                    )
                    if current["owner"] != owner:
                        log.event(LOG, "expired lease taken over", model=model, previous=current["owner"], owner=owner)
                else:
                    left = current["expires"] - now
                    raise LeaseHeld(
                        f"'{model}' is being released by run {current['owner']} (lease for {left:.0f} s more); "
                        "wait for it to finish, or for the lease to expire if that run died."
                    )
                return json.loads(body)
            except VersionConflict:
                continue  # someone wrote between our read and our write: read again
        raise LeaseHeld(f"the release lease of '{model}' is contended; try again.")

    def release_lease(self, model: str, owner: str) -> bool:
        """Give the lease back if `owner` holds it; False if someone else does (or nobody)."""
        key = self._key("leases", f"{model}.json")
        current, _etag = self._read_lease(key)
        if current is None or current["owner"] != owner:
            return False
        self._call("release the lease", self.s3.delete_object, Bucket=self.bucket, Key=key)
        return True

    def lease(self, model: str) -> dict[str, Any] | None:
        """The model's release lease (owner, acquired, expires as epoch seconds), or None when nobody holds it."""
        return self._read_lease(self._key("leases", f"{model}.json"))[0]

    def break_lease(self, model: str, force: bool = False, by: str = "") -> dict[str, Any] | None:
        """Give back a lease someone else holds, for an operator whose release died. An unexpired lease's
        run may still be alive: it is broken only with `force`. Recorded in the history; returns the lease."""
        key = self._key("leases", f"{model}.json")
        current, _etag = self._read_lease(key)
        if current is None:
            return None
        left = current["expires"] - time.time()
        if left > 0 and not force:
            raise LeaseHeld(
                f"'{model}' is held by {current['owner']} for {left:.0f} s more and that run may still be alive; "
                "make sure it is not, then release with --force."
            )
        self._call("release the lease", self.s3.delete_object, Bucket=self.bucket, Key=key)
        self.record(model, "lease released", None, by, owner=current["owner"], forced=left > 0)
        return current

    def _read_lease(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        body, etag = self._get_with_etag(key)
        return (json.loads(body), etag) if body is not None else (None, None)

    # ------------------------------------------------------------------------------- history
    def record(self, model: str, event: str, version: int | None = None, run_id: str = "", **details: Any) -> str:
        """Append one event: its own object, never a read-modify-write."""
        now = utc_now()
        stamp = now.replace("-", "").replace(":", "")
        key = self._key("history", model, f"{stamp}-{uuid.uuid4().hex[:8]}-{event}.json")
        body = {"time": now, "model": model, "event": event, "version": version, "run_id": run_id, **details}
        self._put_new(key, json.dumps(body, sort_keys=True, default=str).encode())
        return key

    def history(self, model: str) -> list[dict[str, Any]]:
        prefix = self._key("history", model) + "/"
        keys = sorted(e["Key"] for e in self._list(prefix) if "Key" in e)
        return [json.loads(self._get(k) or b"{}") for k in keys]

    # ---------------------------------------------------------------------------- listing / gc
    def models(self) -> list[str]:
        names = set(self._children(self._key(PRODUCTION) + "/"))
        names |= {
            c.removesuffix(CANDIDATE_SUFFIX)
            for c in self._children(self._key(STAGING) + "/")
            if c.endswith(CANDIDATE_SUFFIX)
        }
        return sorted(n for n in names if not n.startswith("."))

    def incomplete_versions(self, model: str) -> list[tuple[int, bool]]:
        """(version, staged) of version folders that have files but no manifest."""
        out = []
        for staged, folder in (
            (True, self._key(STAGING, candidate_name(model))),
            (False, self._key(PRODUCTION, model)),
        ):
            for child in self._children(folder + "/"):
                if child.isdigit() and not self._exists(f"{folder}/{child}/{MANIFEST}"):
                    out.append((int(child), staged))
        return sorted(out)

    def gc(
        self, grace_seconds: float = 3600.0, dry_run: bool = False, model: str | None = None, keep: int | None = None
    ) -> list[str]:
        """Remove version folders without a manifest whose allocation is older than the grace period, and
        with `keep`, sealed versions beyond the newest `keep` (see `retire`)."""
        removed = []
        for name in [model] if model else self.models():
            allocations = self.allocated_versions(name)
            for version, staged in self.incomplete_versions(name):
                allocated = allocations.get(version)
                age = time.time() - allocated["modified"].timestamp() if allocated else float("inf")
                if age < grace_seconds:
                    continue  # a publish may still be writing it
                prefix = self.version_prefix(name, version, staged)
                if not dry_run:
                    self._delete_prefix(prefix)
                removed.append(f"s3://{self.bucket}/{prefix}")
            if keep is not None:
                removed += self.retire(name, keep, dry_run)
        return removed

    def retire(self, model: str, keep: int, dry_run: bool = False) -> list[str]:
        """Remove sealed versions older than the newest `keep`, in staging and production, except any the
        desired state serves. Triton downloads every version folder of a model from S3 on each load, so
        old versions make every load slower. Manifest first: a half-removed version is simply incomplete.
        Version numbers are never reused (their allocations stay), nor is the history touched."""
        if keep < 1:
            raise RepositoryError("keep at least 1 version: the newest is the one being released.")
        desired, _ = self.desired_config(model)
        served = set(desired.version_policy.specific.versions) if desired else set()
        removed = []
        for staged in (True, False):
            for version in self.versions(model, staged)[:-keep]:
                if version in served:
                    continue
                prefix = self.version_prefix(model, version, staged)
                if not dry_run:
                    self._call("retire a version", self.s3.delete_object, Bucket=self.bucket, Key=prefix + MANIFEST)
                    self._delete_prefix(prefix)
                removed.append(f"s3://{self.bucket}/{prefix}")
        return removed
