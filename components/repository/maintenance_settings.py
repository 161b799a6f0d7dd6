"""The repository maintenance commands' settings (`tritonship repo gc`, `tritonship lease release`), whose fields
are the commands' options (components/settings_model.py says how); none is a pipeline parameter."""

from __future__ import annotations

from typing import Annotated

from components.settings import DEFAULT_CLEANUP_GRACE_S
from components.settings_model import StepSettings, setting, step_settings


@step_settings("repo gc")
class RepoGcSettings(StepSettings):
    grace: Annotated[
        float,
        setting("seconds an incomplete version is left alone (a publish may be running)", pipeline=None, ge=0),
    ] = DEFAULT_CLEANUP_GRACE_S
    keep: Annotated[
        int,
        setting(
            "also retire sealed versions beyond the newest KEEP (never a served one); 0 keeps all", pipeline=None, ge=0
        ),
    ] = 0
    dry_run: Annotated[bool, setting("only list what would be removed", pipeline=None)] = False


@step_settings("lease release")
class LeaseReleaseSettings(StepSettings):
    force: Annotated[
        bool, setting("also while the lease has not expired (its run may still be alive)", pipeline=None)
    ] = False
