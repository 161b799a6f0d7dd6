"""The repository maintenance commands' settings (`tritonship repo gc`, `tritonship lease release`), with their
flat tables as the CLI takes them (components/settings.py says how)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from components.settings import DEFAULT_CLEANUP_GRACE_S, FlatSettings, Parameter, refuse_invalid

REPO_GC_PARAMETERS = {
    "grace": Parameter(
        DEFAULT_CLEANUP_GRACE_S, "seconds an incomplete version is left alone (a publish may be running)", None
    ),
    "keep": Parameter(0, "also retire sealed versions beyond the newest KEEP (never a served one); 0 keeps all", None),
    "dry_run": Parameter(False, "only list what would be removed", None),
}


@dataclass(frozen=True)
class RepoGcSettings(FlatSettings):
    PARAMETERS: ClassVar = REPO_GC_PARAMETERS
    WHAT: ClassVar = "repo gc"
    grace: float = DEFAULT_CLEANUP_GRACE_S
    keep: int = 0
    dry_run: bool = False

    def __post_init__(self) -> None:
        refuse_invalid(
            "repo gc",
            [
                f"grace must not be negative, not {self.grace}" if self.grace < 0 else "",
                f"keep must not be negative, not {self.keep}" if self.keep < 0 else "",
            ],
        )


LEASE_RELEASE_PARAMETERS = {
    "force": Parameter(False, "also while the lease has not expired (its run may still be alive)", None)
}


@dataclass(frozen=True)
class LeaseReleaseSettings(FlatSettings):
    PARAMETERS: ClassVar = LEASE_RELEASE_PARAMETERS
    WHAT: ClassVar = "lease release"
    force: bool = False
