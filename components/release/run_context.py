"""What every release step is handed beside its settings: which release this is and where it runs.

A step is called as `step(context, settings, *its inputs)`, by the CLI and by the KFP op alike: the context says
the repository, the model and version, the gate server, S3 and the run; the settings are the step's settings type,
whole (components/release/step_settings.py lists which step takes which)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from components.errors import TritonshipError
from components.repository import ModelRepository, lease_owner
from components.s3 import S3Settings
from components.serving.replicas import Replica


@dataclass(frozen=True)
class RunContext:
    repository: str  # s3://bucket/prefix
    model: str
    version: int = 0  # the candidate's; 0 where the step needs none (calibrate measures the stable version)
    gate: Replica | None = None  # the gate server this step measures on
    s3: S3Settings | None = None  # None: from the environment
    run_id: str = ""  # the pipeline run's id; "" by hand

    @classmethod
    def of_task(
        cls,
        repository: str,
        model: str,
        version: int = 0,
        gate: Replica | None = None,
        *,
        s3_endpoint: str,
        run_id: str,
    ) -> RunContext:
        """A pipeline task's: S3's credentials from the task's environment (the pipeline's secret), its endpoint as
        the pipeline names it; KFP may hand the version over as a float."""
        return cls(repository, model, int(version), gate, S3Settings.from_env(s3_endpoint), run_id)

    def repo(self) -> ModelRepository:
        return ModelRepository(self.repository, self.s3)

    @property
    def gate_url(self) -> str:
        if self.gate is None:
            raise TritonshipError(f"no gate server was given for {self.model}; give --gate (host:port).")
        return self.gate.url

    @property
    def metrics_url(self) -> str:
        return self.gate.metrics_url if self.gate else ""

    @property
    def lease_owner(self) -> str:
        """Who holds the model's release lease for this run (components/repository/leases.py)."""
        return lease_owner(self.run_id, self.model, self.version)

    def on(self, gate: Replica) -> RunContext:
        """The same release, on another gate server (the one stage took)."""
        return dataclasses.replace(self, gate=gate)
