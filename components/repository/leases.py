"""The leases, taken and renewed with S3 conditional writes and expiring if their run dies: the release lease (one
release of a model at a time; shown and broken by an operator, recorded in the history) and the gate lease (one
measurement at a time on a gate server, whatever the model)."""

from __future__ import annotations

import json
import time
from typing import Any

from components import log
from components.repository.history import History
from components.repository.store import RepositoryError, VersionConflict, gate_slug, utc_now
from components.settings import DEFAULT_LEASE_S

LOG = log.get("repository")
DEFAULT_LEASE_SECONDS = DEFAULT_LEASE_S


class LeaseHeld(RepositoryError):
    """Another run holds the lease: it is releasing the same model, or measuring on the same gate server."""

    exit_code = 3

    def __init__(self, message: str, holder: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.holder = holder


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
        return self._acquire(self._key("leases", f"{model}.json"), f"'{model}'", owner, seconds, "being released by")

    def acquire_gate(self, gate_url: str, owner: str, seconds: float) -> dict[str, Any]:
        """Take (or renew) the gate server's lease: one measurement (quality, tune, gate) at a time on it."""
        return self._acquire(self._gate_key(gate_url), f"the gate server {gate_url}", owner, seconds, "measuring for")

    def release_gate(self, gate_url: str, owner: str) -> bool:
        """Give the gate server's lease back if `owner` holds it."""
        return self._release(self._gate_key(gate_url), owner)

    def gate_holder(self, gate_url: str) -> dict[str, Any] | None:
        """The gate server's lease (owner, acquired, expires), or None when no measurement holds it."""
        return self._read_lease(self._gate_key(gate_url))[0]

    def _gate_key(self, gate_url: str) -> str:
        return self._key("leases", "gates", f"{gate_slug(gate_url)}.json")

    def _acquire(self, key: str, what: str, owner: str, seconds: float, doing: str) -> dict[str, Any]:
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
                        log.event(LOG, "expired lease taken over", key=key, previous=current["owner"], owner=owner)
                else:
                    left = current["expires"] - now
                    raise LeaseHeld(
                        f"{what} is {doing} run {current['owner']} (lease for {left:.0f} s more); "
                        "wait for it to finish, or for the lease to expire if that run died.",
                        holder=current,
                    )
                return json.loads(body)
            except VersionConflict:
                continue  # someone wrote between our read and our write: read again
        raise LeaseHeld(f"the lease of {what} is contended; try again.")

    def release_lease(self, model: str, owner: str) -> bool:
        """Give the lease back if `owner` holds it; False if someone else does (or nobody)."""
        return self._release(self._key("leases", f"{model}.json"), owner)

    def _release(self, key: str, owner: str) -> bool:
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
