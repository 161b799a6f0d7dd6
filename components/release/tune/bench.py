"""The tune step's bench: the candidate reloaded with each setting on the gate server (through the load API with a
config override; S3 is never written) and measured with perf_analyzer at the gate's load (components/release/tune/tune.py
says how the settings are searched)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np

from components.model import ensemble, model_config
from components.model.model_config import ServingSettings
from components.release.results import Trial
from components.release.stage import CandidateVersion
from components.repository import candidate_name
from components.serving import perf, server_metrics
from components.serving.triton_admin import TritonAdmin, TritonError
from components.settings import LoadSettings

WARM_UP_REQUESTS = 20


class GateBench:
    """Loads the candidate with given settings on the gate server and measures it."""

    def __init__(
        self, gate_url: str, candidate: CandidateVersion, load: LoadSettings, timeout: float, metrics_url: str = ""
    ) -> None:
        self.admin = TritonAdmin(gate_url)
        self.metrics_url = metrics_url
        self.candidate = candidate
        self.load = load
        self.timeout = timeout
        self.name = candidate_name(candidate.model)
        self._tmp = tempfile.TemporaryDirectory(prefix="tritonship-tune-")
        self.data = perf.write_input_data(
            candidate.golden_inputs, Path(self._tmp.name) / "input.json", batched=candidate.config.max_batch_size > 0
        )

    def close(self) -> None:
        self.admin.close()
        self._tmp.cleanup()

    def apply(self, settings: ServingSettings) -> None:
        version = self.candidate.version
        if not self.candidate.members:
            self.admin.load(self.name, model_config.with_settings(self.candidate.candidate_config(), settings))
            self.admin.wait_ready(self.name, version)
            return
        members = {c.name: c for c in self.candidate.member_candidate_configs()}
        entry, tuned = ensemble.with_serving_settings(self.candidate.candidate_config(), members, settings)
        self.admin.reload_ensemble(self.name, entry, tuned, version)

    def measure(self, settings: ServingSettings) -> Trial:
        trial = Trial(settings)
        try:
            self.apply(settings)
        except TritonError as exc:
            trial.problem = f"not loaded: {exc}"
            return trial
        first = {k: v[:1] for k, v in self.candidate.golden_inputs.items()}
        for _ in range(WARM_UP_REQUESTS):
            self.admin.infer(self.name, first, self.candidate.output_names, self.candidate.version)
        with server_metrics.Sampler(self.metrics_url) if self.metrics_url else contextlib.nullcontext() as sampler:
            run = perf.measure(
                self.admin.url,
                self.name,
                self.data,
                self.load,
                version=str(self.candidate.version),
                timeout=self.timeout,
            )
        trial.server = sampler.summary() if sampler else {}
        if not run.ok:
            trial.problem = f"perf_analyzer: {run.reason}"
            return trial
        trial.throughput = run.points[0].throughput
        # pooled over every request of the measured windows, as the gate reads it
        trial.p99_ms = (
            float(np.percentile(run.latencies_us, 99)) / 1000 if run.latencies_us.size else run.points[0].p99_us / 1000
        )
        return trial
