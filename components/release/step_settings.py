"""The one list of steps: which settings type each command and each pipeline task takes (the gate's is
components/settings.py's, export's and compile's components/model/settings.py's; publish's, stage's, tune's,
quality's and promote's are beside their steps). A settings type per step has named defaults, is validated where
it is built, and its fields are the step's `tritonship` options and the pipeline's parameters
(components/settings_model.py says how).

reject has nothing to set: its input (the verdict) is all it takes."""

from __future__ import annotations

import dataclasses
from typing import Any

from components.model.settings import CompileSettings, ExportSettings
from components.release.promote.settings import PromoteSettings
from components.release.publish import PublishSettings
from components.release.quality.spec import QualitySettings
from components.release.stage import ModelLoadSettings
from components.release.tune.settings import TuneSettings
from components.repository.maintenance_settings import LeaseReleaseSettings, RepoGcSettings
from components.settings import PIPELINE_DIFFERENCES, GateSettings
from components.settings_model import Option, SettingsError, StepSettings

# Every step's settings type by its `tritonship` command (reject has none: see the docstring).
COMMANDS: dict[tuple[str, ...], type[StepSettings]] = {
    ("export",): ExportSettings,
    ("compile",): CompileSettings,
    ("publish",): PublishSettings,
    ("stage",): ModelLoadSettings,
    ("tune",): TuneSettings,
    ("quality",): QualitySettings,
    ("gate",): GateSettings,
    ("calibrate", "gate"): GateSettings,  # measured as the gate measures
    ("calibrate", "quality"): QualitySettings,  # measured as the quality step measures
    ("promote",): PromoteSettings,
    ("repo", "gc"): RepoGcSettings,
    ("lease", "release"): LeaseReleaseSettings,
}
# The pipeline's tasks' settings: settings_op (pipelines/kfp_components.py) hands each task its own, by these names.
PIPELINE_STEPS: dict[str, type[StepSettings]] = {
    "export": ExportSettings,
    "compile": CompileSettings,
    "publish": PublishSettings,
    "load": ModelLoadSettings,  # stage's
    "tune": TuneSettings,
    "quality": QualitySettings,
    "gate": GateSettings,
    "promote": PromoteSettings,
}


def pipeline_parameters() -> dict[str, Option]:
    """Every step setting that is a pipeline parameter, by its pipeline name, with the pipeline's default
    (components/settings.py PIPELINE_DIFFERENCES). One parameter may feed several steps (load_timeout_s: stage's
    and promote's)."""
    found: dict[str, Option] = {}
    for kind in PIPELINE_STEPS.values():
        for option in kind.options().values():
            if option.pipeline is None:
                continue
            chosen = dataclasses.replace(option, default=PIPELINE_DIFFERENCES.get(option.pipeline, option.default))
            same = found.setdefault(option.pipeline, chosen)
            if (same.help, same.default, same.pipeline_kind) != (chosen.help, chosen.default, chosen.pipeline_kind):
                raise TypeError(f"the pipeline parameter {option.pipeline} is two different settings")
    return found


def pipeline_settings(given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pipeline's parameters (by pipeline name; a missing one takes the pipeline's default) as each task's
    settings, whole (to_dict: the task rebuilds them with from_dict), by step; every step's are built, so checked:
    a wrong value fails before anything runs. Tune measures at the gate's load, within its p99 limit."""
    parameters = pipeline_parameters()
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        raise SettingsError("pipeline", [f"no parameter named {', '.join(unknown)}"])
    values = {name: given.get(name, p.default) for name, p in parameters.items()}
    steps: dict[str, Any] = {
        step: kind.from_flat(**{o.name: values[o.pipeline] for o in kind.options().values() if o.pipeline})
        for step, kind in PIPELINE_STEPS.items()
    }
    steps["tune"] = steps["tune"].at_gate(steps["gate"])
    return {step: chosen.to_dict() for step, chosen in steps.items()}
