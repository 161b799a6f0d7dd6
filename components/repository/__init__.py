"""The S3 model repository: immutable versions, a manifest written last, staging, history, desired state.

Layout under a repository root `s3://bucket/root` (docs/design.md section 2):

    root/models/<model>/config.pbtxt            desired state: version_policy pinned to the promoted version
    root/models/<model>/<v>/...                 promoted versions (copied from staging), manifest.json last
    root/staging/<model>__candidate/<v>/...     published candidates; only the gate server mounts staging/
    root/versions/<model>/<v>                   allocation markers (conditional writes: one owner per number)
    root/history/<model>/<time>-<id>.json       append-only events, one object each
    root/leases/<model>.json                    the per-model release lease
    root/leases/gates/<host_port>.json          the gate lease: one measurement at a time per gate server
    root/calibration/<host_port>/<model>.json   an equal candidate's noise on that gate server, as calibrated
    root/promotions/<model>.json                a promotion in progress (its run, versions and phase)

Production Tritons mount root/models, the gate mounts root/models and root/staging. A version
directory without manifest.json does not exist for readers; `gc` removes it after a grace period.
"""

from __future__ import annotations

from components.repository.calibrations import Calibrations
from components.repository.desired import DesiredState
from components.repository.history import History
from components.repository.leases import DEFAULT_LEASE_SECONDS, LeaseHeld, Leases, lease_owner
from components.repository.maintenance import Maintenance
from components.repository.manifests import Manifest, Manifests, content_digest
from components.repository.promotions import Promotions
from components.repository.store import (
    TRANSFER,
    RepositoryError,
    VersionConflict,
    candidate_name,
    parse_utc,
    sha256_file,
    utc_now,
)
from components.repository.versions import Versions


class ModelRepository(Maintenance, Manifests, Versions, DesiredState, Leases, History, Promotions, Calibrations):
    """One repository root on S3: the one entry point; each part lives in its own module of this package."""


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "TRANSFER",
    "DesiredState",
    "History",
    "LeaseHeld",
    "Leases",
    "Maintenance",
    "Manifest",
    "Manifests",
    "ModelRepository",
    "Promotions",
    "RepositoryError",
    "VersionConflict",
    "Versions",
    "candidate_name",
    "content_digest",
    "lease_owner",
    "parse_utc",
    "sha256_file",
    "utc_now",
]
