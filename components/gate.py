"""Gate step: measure the candidate against the stable version on the gate server and decide.

Candidate and stable are measured alternately (stable, candidate, candidate, stable, ...) in several
rounds with perf_analyzer at the configured load, using the golden inputs as request data. Each
round gives a paired ratio candidate/stable, which cancels slow drift of the machine; the decision
uses the median ratio over the rounds.

Verdicts (fail closed: only `pass` promotes):
- fail: the accuracy check failed, an absolute limit or a relative limit is exceeded, perf_analyzer
  is missing or crashed, the gate server is unreachable, the candidate is not loaded;
- inconclusive: a measurement did not stabilise, the rounds disagree more than the noise limit, the
  stable version could not be measured, or no limit applies at all;
- pass: every limit that applies is met by measurements that all succeeded.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from components import ensemble, log, model_config, perf
from components.errors import TritonshipError
from components.repository import ModelRepository, candidate_name
from components.s3repo import S3Settings
from components.stage import CandidateVersion, StageResult, read_candidate
from components.tools import find_perf_analyzer
from components.triton_admin import TritonAdmin, TritonError

if TYPE_CHECKING:
    from components.tune import TuneResult

LOG = log.get("gate")
Verdict = Literal["pass", "fail", "inconclusive"]
BOOTSTRAP_RESAMPLES = 200
WARM_UP_REQUESTS = 50


@dataclass(frozen=True)
class Thresholds:
    max_p99_ms: float | None = None  # absolute: candidate p99 latency at the gate load
    min_throughput: float | None = None  # absolute: candidate inferences/s at the gate load
    max_p99_regression_pct: float | None = 10.0  # relative to stable
    max_throughput_regression_pct: float | None = 10.0  # relative to stable

    @property
    def relative(self) -> bool:
        return self.max_p99_regression_pct is not None or self.max_throughput_regression_pct is not None

    @property
    def absolute(self) -> bool:
        return self.max_p99_ms is not None or self.min_throughput is not None


@dataclass(frozen=True)
class GateSettings:
    load: perf.LoadSettings = field(default_factory=perf.LoadSettings)
    thresholds: Thresholds = field(default_factory=Thresholds)
    rounds: int = 5
    # the 90% bootstrap interval of the candidate/stable ratios wider than this: inconclusive
    max_noise_pct: float = 40.0
    perf_timeout_s: float = 300.0


@dataclass
class Figures:
    """One model's measurements over the rounds: per-round figures from perf_analyzer's CSV and every
    request's latency from its profile export (ms)."""

    throughput: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    samples: list[np.ndarray] = field(default_factory=list, repr=False)

    def add(self, point: perf.LoadPoint, latencies_us: np.ndarray) -> None:
        self.throughput.append(point.throughput)
        self.p50_ms.append(point.p50_us / 1000)
        self.p99_ms.append(point.p99_us / 1000)
        # Without request data (an old perf_analyzer), the round's own p99 stands for its tail.
        self.samples.append(latencies_us / 1000 if latencies_us.size else np.array([point.p99_us / 1000]))

    def pooled(self, q: float, rounds: np.ndarray | None = None) -> float:
        """The q-th percentile over every request of the given rounds (all by default)."""
        chosen = self.samples if rounds is None else [self.samples[i] for i in rounds]
        return float(np.percentile(np.concatenate(chosen), q))

    def summary(self) -> dict[str, float | None]:
        """Throughput: median over rounds; p50 and p99: over all requests of all rounds together."""
        if not self.throughput:
            return {"throughput": None, "p50_ms": None, "p99_ms": None, "requests": 0}
        return {
            "throughput": statistics.median(self.throughput),
            "p50_ms": self.pooled(50),
            "p99_ms": self.pooled(99),
            "requests": int(sum(s.size for s in self.samples)),
        }

    def to_dict(self) -> dict[str, list[float]]:
        return {"throughput": self.throughput, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms}


@dataclass
class GateResult:
    model: str
    version: int
    stable_version: int | None
    verdict: Verdict
    reasons: list[str]
    candidate: Figures = field(default_factory=Figures)
    stable: Figures = field(default_factory=Figures)
    p99_regression_pct: float | None = None
    throughput_regression_pct: float | None = None
    noise_pct: float | None = None
    measurement_seconds: float = 0.0
    stable_load_seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    tuning: dict[str, Any] | None = None  # the tune step's table and chosen serving settings (TuneResult)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("candidate", "stable")}
        data["candidate"], data["stable"] = self.candidate.to_dict(), self.stable.to_dict()
        data["candidate_summary"] = self.candidate.summary()
        data["stable_summary"] = self.stable.summary()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


def paired_intervals(candidate: Figures, stable: Figures, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """90% bootstrap intervals of the p99 ratio (pooled requests) and the throughput ratio (median of the
    paired rounds), resampling whole rounds so that the spread between rounds is what is measured."""
    rng = np.random.default_rng(seed)
    rounds = len(candidate.throughput)
    p99, throughput = [], []
    for chosen in rng.integers(0, rounds, size=(BOOTSTRAP_RESAMPLES, rounds)):
        p99.append(candidate.pooled(99, chosen) / stable.pooled(99, chosen))
        throughput.append(statistics.median(candidate.throughput[i] / stable.throughput[i] for i in chosen))
    return np.percentile(p99, [5, 95]), np.percentile(throughput, [5, 95])


def evaluate(result: GateResult, settings: GateSettings) -> None:
    """Fill in verdict, reasons and the relative figures from the measurements."""
    t = settings.thresholds
    fails: list[str] = []
    doubts: list[str] = []
    cand = result.candidate.summary()
    if t.max_p99_ms is not None and cand["p99_ms"] is not None and cand["p99_ms"] > t.max_p99_ms:
        fails.append(f"candidate p99 {cand['p99_ms']:.2f} ms exceeds the limit of {t.max_p99_ms:g} ms")
    if t.min_throughput is not None and cand["throughput"] is not None and cand["throughput"] < t.min_throughput:
        fails.append(f"candidate throughput {cand['throughput']:.0f}/s is below the limit of {t.min_throughput:g}/s")
    if result.stable_version is not None and t.relative and result.stable.throughput:
        stable = result.stable.summary()
        tp_ratios = [c / s for c, s in zip(result.candidate.throughput, result.stable.throughput, strict=True)]
        result.p99_regression_pct = (cand["p99_ms"] / stable["p99_ms"] - 1) * 100
        result.throughput_regression_pct = (1 - statistics.median(tp_ratios)) * 100
        p99_interval, tp_interval = paired_intervals(result.candidate, result.stable)
        result.noise_pct = float(max(np.ptp(p99_interval), np.ptp(tp_interval)) * 100)
        if t.max_p99_regression_pct is not None and result.p99_regression_pct > t.max_p99_regression_pct:
            fails.append(
                f"p99 latency regressed {result.p99_regression_pct:+.1f}% against stable v{result.stable_version} "
                f"(limit {t.max_p99_regression_pct:g}%)"
            )
        if (
            t.max_throughput_regression_pct is not None
            and result.throughput_regression_pct > t.max_throughput_regression_pct
        ):
            fails.append(
                f"throughput dropped {result.throughput_regression_pct:.1f}% against stable v{result.stable_version} "
                f"(limit {t.max_throughput_regression_pct:g}%)"
            )
        if result.noise_pct > settings.max_noise_pct:
            doubts.append(
                f"the rounds disagree: the 90% interval of the candidate/stable ratio is {result.noise_pct:.0f}% wide "
                f"(limit {settings.max_noise_pct:g}%), too noisy to decide"
            )
    if not t.absolute and not (t.relative and result.stable_version is not None):
        doubts.append("no limit applies (first release without absolute limits): nothing to judge the candidate by")
    if fails:
        result.verdict, result.reasons = "fail", fails + result.reasons
    elif doubts or result.reasons:
        result.verdict, result.reasons = "inconclusive", doubts + result.reasons
    else:
        result.verdict = "pass"
        result.reasons = ["every limit that applies is met"]


def _failed(result: GateResult, reason: str) -> GateResult:
    result.verdict, result.reasons = "fail", [reason]
    return result


def gate(
    repository: str,
    model: str,
    version: int,
    gate_url: str,
    settings: GateSettings | None = None,
    stage_result: StageResult | None = None,
    out_dir: Path | None = None,
    s3: S3Settings | None = None,
    run_id: str = "",
    tuning: TuneResult | None = None,
) -> GateResult:
    """The gate step. Never raises for a measurement problem: it becomes the verdict.

    With `tuning`, the candidate is measured as the tune step left it loaded: with the chosen settings."""
    settings = settings or GateSettings()
    repo = ModelRepository(repository, s3)
    desired, _ = repo.desired_config(model)
    stable_version = desired.version_policy.specific.versions[0] if desired else None
    result = GateResult(model, version, stable_version, "inconclusive", [], settings=_settings_dict(settings))
    result.tuning = json.loads(tuning.to_json()) if tuning is not None else None
    try:
        _measure(repo, result, settings, stage_result, desired, gate_url, out_dir)
    except TritonshipError as exc:
        _failed(result, str(exc))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "verdict.json").write_text(result.to_json())
        from components import report

        report.write(result, out_dir)
    repo.record(
        model, "gate", version, run_id, verdict=result.verdict, reasons=result.reasons,
        stable_version=stable_version, candidate=result.candidate.summary(), stable=result.stable.summary(),
        p99_regression_pct=result.p99_regression_pct, throughput_regression_pct=result.throughput_regression_pct,
        serving=result.tuning["chosen"] if result.tuning else None,
    )  # fmt: skip
    log.event(LOG, "verdict", model=model, version=version, verdict=result.verdict, reasons="; ".join(result.reasons))
    return result


def _measure(
    repo: ModelRepository,
    result: GateResult,
    settings: GateSettings,
    stage_result: StageResult | None,
    desired: model_config.ModelConfig | None,
    gate_url: str,
    out_dir: Path | None,
) -> None:
    if stage_result is not None and stage_result.load_error:
        _failed(result, f"the gate server could not load the candidate: {stage_result.load_error}")
        return
    if stage_result is not None and not stage_result.accuracy_passed:
        failed = [r.name for r in stage_result.accuracy if not r.passed]
        _failed(
            result,
            f"the accuracy check failed for output(s) {', '.join(failed)}: the candidate answers differ from the golden outputs",
        )
        return
    find_perf_analyzer()  # raises a plain error if it is missing
    candidate = read_candidate(repo, result.model, result.version)
    cand_name = candidate_name(result.model)
    with TritonAdmin(gate_url) as admin:
        admin.ensure_live()
        if not admin.is_ready(cand_name, result.version):
            _failed(
                result,
                f"the candidate {cand_name} v{result.version} is not loaded on the gate server {admin.url}; run the stage step first",
            )
            return
        targets = [(cand_name, str(result.version), result.candidate)]
        if desired is not None and settings.thresholds.relative:
            try:
                started = time.monotonic()
                for member in ensemble.member_names(desired):  # an ensemble's stable members first
                    member_config, _ = repo.desired_config(member)
                    admin.load(member, member_config)
                    admin.wait_ready(member, ensemble.pinned_member_version(desired))
                admin.load(result.model, desired)
                admin.wait_ready(result.model, result.stable_version or "")
                result.stable_load_seconds = time.monotonic() - started
                targets.append((result.model, str(result.stable_version), result.stable))
            except TritonError as exc:
                result.reasons.append(f"the stable version could not be loaded on the gate server: {exc}")
                return
        for name, version, _figures in targets:  # a freshly loaded model's first requests are slow
            first = {k: v[:1] for k, v in candidate.golden_inputs.items()}
            for _ in range(WARM_UP_REQUESTS):
                admin.infer(name, first, candidate.output_names, version)
        try:
            _rounds(admin.url, candidate, targets, settings, result, out_dir)
        finally:
            if len(targets) > 1:
                admin.unload_with_members(result.model)
    if not result.reasons:
        evaluate(result, settings)


def _rounds(
    url: str,
    candidate: CandidateVersion,
    targets: list[tuple[str, str, Figures]],
    settings: GateSettings,
    result: GateResult,
    out_dir: Path | None,
) -> None:
    with tempfile.TemporaryDirectory(prefix="tritonship-gate-") as tmp:
        data = perf.write_input_data(
            candidate.golden_inputs, Path(tmp) / "input.json", batched=candidate.config.max_batch_size > 0
        )
        for round_index in range(settings.rounds):
            order = targets if round_index % 2 == 0 else list(reversed(targets))
            for name, version, figures in order:
                run = perf.measure(url, name, data, settings.load, version=version, timeout=settings.perf_timeout_s)
                result.measurement_seconds += run.seconds
                result.runs.append(
                    {"round": round_index, **{k: v for k, v in run.to_dict().items() if k != "csv_text"}}
                )
                if out_dir is not None and run.csv_text:
                    raw = out_dir / "raw"
                    raw.mkdir(parents=True, exist_ok=True)
                    (raw / f"{name}-v{version}-round{round_index}.csv").write_text(run.csv_text)
                if not run.ok:
                    # An unstable window is noise (inconclusive); a crash, no valid request or an
                    # unreachable server is a failure.
                    result.verdict = "inconclusive" if run.exit_code == 2 else "fail"
                    result.reasons.append(
                        f"perf_analyzer on {name} v{version} (round {round_index + 1}) {_exit_words(run)}: {run.reason}"
                    )
                    return
                figures.add(run.points[0], run.latencies_us)


def _exit_words(run: perf.PerfRun) -> str:
    return "did not stabilise" if run.exit_code == 2 else f"exited {run.exit_code}"


def _settings_dict(settings: GateSettings) -> dict[str, Any]:
    return {
        "load": asdict(settings.load),
        "thresholds": asdict(settings.thresholds),
        "rounds": settings.rounds,
        "max_noise_pct": settings.max_noise_pct,
    }
