"""S3 primitives of the repository: keys under the root, reads, conditional writes, listings, with errors a
person can act on; and the layout's paths (the layout is in components/repository/__init__.py)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from components.errors import TritonshipError
from components.model.model_config import CANDIDATE_SUFFIX
from components.s3 import S3_EXCEPTIONS, S3Error, S3Settings, explain, split_s3_uri

MANIFEST = "manifest.json"
CONFIG = "config.pbtxt"
PRODUCTION = "models"
STAGING = "staging"


def gate_slug(gate_url: str) -> str:
    """A gate server's URL as one key part (host_port): its lease and its calibrations are filed under it."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", gate_url.split("://")[-1]).strip("_")


# Multipart above 16 MiB in 16 MiB parts, 4 in flight: the fastest multipart setting benchmarks/multipart.py
# measured (as fast as one PUT there); parts keep retries small, and a single PUT stops at 5 GiB.
TRANSFER = TransferConfig(multipart_threshold=16 * 2**20, multipart_chunksize=16 * 2**20, max_concurrency=4)


class RepositoryError(TritonshipError):
    """The repository is missing, inconsistent or refused an operation."""


class VersionConflict(RepositoryError):
    """Someone else wrote the object first (a conditional write failed)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def candidate_name(model: str) -> str:
    return f"{model}{CANDIDATE_SUFFIX}"


TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # history events' and leases' times


def utc_now() -> str:
    return datetime.now(UTC).strftime(TIME_FORMAT)


def parse_utc(text: str) -> datetime:
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=UTC)


class Store:
    """One repository root on S3: its keys and the S3 calls every part of the repository makes."""

    def __init__(self, uri: str, settings: S3Settings | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.root = split_s3_uri(self.uri)
        self.settings = settings or S3Settings.from_env()
        self.s3 = self.settings.client()

    # ------------------------------------------------------------------------------------ paths
    def _key(self, *parts: str | int) -> str:
        return "/".join(str(p).strip("/") for p in (self.root, *parts) if str(p).strip("/"))

    def production_uri(self) -> str:
        return f"s3://{self.bucket}/{self._key(PRODUCTION)}"

    def staging_uri(self) -> str:
        return f"s3://{self.bucket}/{self._key(STAGING)}"

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
            response = self._call(
                "delete objects",
                self.s3.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": keys[start : start + 1000]},
            )
            if response.get("Errors"):  # DeleteObjects answers 200 and lists the keys it refused
                first = response["Errors"][0]
                raise RepositoryError(
                    f"S3 refused to delete {len(response['Errors'])} object(s) under s3://{self.bucket}/{prefix} "
                    f"({first.get('Code')} on {first.get('Key')}); check that these credentials may delete there."
                )
        return len(keys)

    def _exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except S3_EXCEPTIONS as exc:
            if isinstance(exc, ClientError) and exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise explain(exc, f"read s3://{self.bucket}/{key}", self.bucket) from None
