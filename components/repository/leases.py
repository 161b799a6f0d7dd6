"""The release lease: one release of a model at a time, taken and renewed with S3 conditional writes,
expiring if its run dies; shown and broken by an operator (recorded in the history)."""

from __future__ import annotations

import json
import time
from typing import Any

from components import log
from components.repository.history import History
from components.repository.store import RepositoryError, VersionConflict, utc_now
from components.settings import DEFAULT_LEASE_S

LOG = log.get("repository")
DEFAULT_LEASE_SECONDS = DEFAULT_LEASE_S


class LeaseHeld(RepositoryError):
    """Another run is releasing the same model."""

    exit_code = 3


def lease_owner(run_id: str, model: str, version: int) -> str:
    """Who holds a release: the pipeline run, or (by hand) the model version being released."""
    return run_id or f"manual:{model}:v{version}"


class Leases(History):
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
