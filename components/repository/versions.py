"""Version numbers: each taken by one publish with an S3 conditional write, never reused."""

from __future__ import annotations

import json
import uuid
from typing import Any

from components import log
from components.repository.store import RepositoryError, Store, VersionConflict

LOG = log.get("repository")


class Versions(Store):
    _conditional_writes_checked = False

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
