"""Listing and clean-up: the models, incomplete versions, `gc` of interrupted publishes and `retire` of
old sealed versions (never a served one)."""

from __future__ import annotations

import time

from components.model.model_config import CANDIDATE_SUFFIX
from components.repository.desired import DesiredState
from components.repository.manifests import Manifests
from components.repository.store import MANIFEST, PRODUCTION, STAGING, RepositoryError, candidate_name
from components.repository.versions import Versions
from components.settings import DEFAULT_CLEANUP_GRACE_S


class Maintenance(Manifests, Versions, DesiredState):
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
        self,
        grace_seconds: float = DEFAULT_CLEANUP_GRACE_S,
        dry_run: bool = False,
        model: str | None = None,
        keep: int | None = None,
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
