"""The one list of steps: which settings type each command and each pipeline task takes (the gate's is
components/settings.py's, export's and compile's components/model/settings.py's; publish's, stage's, tune's,
quality's and promote's are beside their steps). A settings type per step has named defaults, is validated where
it is built, and its fields are the step's `tritonship` options and the pipeline's parameters
(components/settings_model.py says how).

reject has nothing to set: its input (the verdict) is all it takes."""

from __future__ import annotations

from components.model.settings import CompileSettings, ExportSettings
from components.release.promote.settings import PromoteSettings
from components.release.publish import PublishSettings
from components.release.quality.spec import QualitySettings
from components.release.stage import ModelLoadSettings
from components.release.tune.settings import TuneSettings
from components.repository.maintenance_settings import LeaseReleaseSettings, RepoGcSettings
from components.settings import PIPELINE_DIFFERENCES, GateSettings
from components.settings_model import Steps, StepSettings

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
# The pipeline's tasks' settings, made from the pipeline's parameters (PIPELINE_STEPS.parameters(), with the pipeline's
# defaults: components/settings.py PIPELINE_DIFFERENCES); settings_op (pipelines/kfp_components.py) hands each task
# its own, by these names.
PIPELINE_STEPS = Steps(
    {
        "export": ExportSettings,
        "compile": CompileSettings,
        "publish": PublishSettings,
        "load": ModelLoadSettings,  # stage's
        "tune": TuneSettings,  # at the gate's load, within its p99 limit (TuneSettings.within)
        "quality": QualitySettings,
        "gate": GateSettings,
        "promote": PromoteSettings,
    },
    defaults=PIPELINE_DIFFERENCES,
)
