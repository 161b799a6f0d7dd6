"""What each step hands to the next: the stage, tune and gate results, with one serialisation (the promotion's are
components/release/promote/records.py).

Every result is a dataclass and a `Result`: `to_json` writes its fields (plus what `derived()` adds for
readers of the file), `from_json` rebuilds it from its field types, checking them, and ignores the derived
keys. The gate's full result (`GateResult`, with every request's latency) is written as a `Verdict`
(verdict.json), which is what the CLI, the pipeline and the report's readers load.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Literal, TypeVar

import numpy as np

from components.model.model_config import ServingSettings
from components.model.parity import OutputParity
from components.release.effects import Effect, RoundFigures, Rounds
from components.serving import perf
from components.serving.perf_output import LoadPoint

R = TypeVar("R", bound="Result")
VerdictName = Literal["pass", "fail", "inconclusive"]


class Result:
    """One serialisation for every result dataclass."""

    def derived(self) -> dict[str, Any]:
        """Figures computed from the fields, written for readers of the JSON and ignored when read back."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {**_plain(self), **self.derived()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    @classmethod
    def from_json(cls: type[R], text: str | bytes) -> R:
        """Raises ValueError, naming what is wrong, for text that is not this result."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON ({exc})") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls: type[R], data: Any) -> R:
        """`data` (parsed JSON) as this result; ValueError, naming what is wrong, when it is not one."""
        return _build(cls, data, cls.__name__)


def _plain(value: Any) -> Any:
    """`value` as JSON's types, as `asdict` makes it, but a record with its own `to_dict` (an `Effect`: its
    status and text) written by it."""
    if is_dataclass(value) and not isinstance(value, type):
        if not isinstance(value, Result) and hasattr(value, "to_dict"):
            return value.to_dict()
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _build(kind: Any, value: Any, where: str) -> Any:
    """`value` (parsed JSON) as an instance of the type `kind`, checked on the way."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _build(next(a for a in args if a is not type(None)), value, where)
    if origin is Literal or (isinstance(kind, type) and issubclass(kind, Enum)):
        allowed = args if origin is Literal else tuple(member.value for member in kind)
        if value not in allowed:
            raise ValueError(f"{where} is {value!r}, not one of {', '.join(map(repr, allowed))}")
        return value if origin is Literal else kind(value)
    if is_dataclass(kind):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is not an object")
        hints = typing.get_type_hints(kind)
        missing = [f.name for f in fields(kind) if f.name not in value and _required(f)]
        if missing:
            raise ValueError(f"{where} has no {', '.join(missing)}")
        known = {f.name for f in fields(kind)}
        return kind(**{k: _build(hints[k], v, f"{where}.{k}") for k, v in value.items() if k in known})
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ValueError(f"{where} is not a list")
        items = [_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where} is not an object")
        return {k: _build(args[1], v, f"{where}.{k}") for k, v in value.items()} if args else value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where} is {value!r}, not a {kind.__name__}")
    return value


def _required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


# ------------------------------------------------------------------------------------------- stage
@dataclass
class StageResult(Result):
    model: str
    version: int
    candidate: str
    gate_url: str
    accuracy_passed: bool
    accuracy: list[OutputParity] = field(default_factory=list)
    load_seconds: float = 0.0
    load_error: str = ""  # Triton refused the candidate (bad config, model that fails to initialise)


# -------------------------------------------------------------------------------------------- tune
@dataclass
class Trial:
    settings: ServingSettings
    throughput: float | None = None
    p99_ms: float | None = None
    problem: str = ""  # why it could not be measured (load refused, perf_analyzer failed)
    server: dict[str, Any] = field(default_factory=dict)  # the gate server's GPU/CPU figures (server_metrics)

    @property
    def measured(self) -> bool:
        return self.throughput is not None and not self.problem

    def row(self) -> dict[str, Any]:
        """Flat: the settings' knobs beside the figures (logs, benchmark tables)."""
        return {**asdict(self.settings), "throughput": self.throughput, "p99_ms": self.p99_ms, "problem": self.problem}

    def gain_pct(self, reference: Trial, rate: float | None = None) -> float:
        """How much better than `reference`, in percent: more throughput at a concurrency; at a fixed
        request rate, which every setting that keeps up serves alike, a lower p99."""
        if rate is None:
            return (self.throughput / reference.throughput - 1) * 100
        return (1 - self.p99_ms / reference.p99_ms) * 100

    @staticmethod
    def combined(trials: list[Trial]) -> Trial:
        """Several measurements of one setting: their mean throughput and their highest p99."""
        throughput = float(np.mean([t.throughput for t in trials]))
        return Trial(trials[0].settings, throughput, max(t.p99_ms for t in trials if t.p99_ms is not None))


@dataclass
class TuneResult(Result):
    model: str
    version: int
    default: ServingSettings
    chosen: ServingSettings
    p99_limit_ms: float | None
    grid_size: int
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0
    enabled: bool = True
    confirmation: str = ""  # whether the search's winner won again when measured beside the default
    request_shapes: dict[str, list[int]] = field(default_factory=dict)  # each input of one measured request
    request_rate: float | None = None  # tuned at this fixed rate (lowest p99 wins), else at a concurrency
    warm_up: Trial | None = None  # the default's run before the search, not counted (tune.tune says why)
    gate_wait_s: float = 0.0  # waited for the gate server while other releases measured there (gate_turn.py)

    def trial(self, settings: ServingSettings) -> Trial | None:
        """The setting's measurement; for one measured twice (the default), the two combined."""
        same = [t for t in self.trials if t.settings == settings]
        measured = [t for t in same if t.measured]
        if len(measured) > 1:
            return Trial.combined(measured)
        return (measured or same or [None])[0]

    @property
    def settings_measured(self) -> int:
        return len({t.settings for t in self.trials})

    def gain_of(self, settings: ServingSettings) -> float | None:
        """A setting's gain over the default's over all their runs, in percent: its mean throughput, or at a
        fixed request rate how much lower its mean p99 is (the mean: the default has more runs, and the
        highest of more runs is higher by chance alone)."""
        default, trial = self.trial(self.default), self.trial(settings)
        if not (default and trial and default.measured and trial.measured and default.throughput):
            return None
        if self.request_rate is None:
            return trial.gain_pct(default)
        mean_p99 = {
            s: float(np.mean([t.p99_ms for t in self.trials if t.settings == s and t.measured]))
            for s in (settings, self.default)
        }
        return (1 - mean_p99[settings] / mean_p99[self.default]) * 100

    @property
    def gain_pct(self) -> float | None:
        """The chosen setting's gain over the default's (gain_of)."""
        return self.gain_of(self.chosen)

    def derived(self) -> dict[str, Any]:
        return {"gain_pct": self.gain_pct, "settings_measured": self.settings_measured}


# ----------------------------------------------------------------------------------------- quality
@dataclass
class MetricVariation(Result):
    """One metric across equally good retrains: each one's value, their spread and the drop it allows."""

    values: list[float]  # each retrain's value on the whole evaluation set, in the order of its versions
    sd_pct: float  # the values' standard deviation, percent of their mean
    interval_half_pct: float  # the quality step's interval half-width for one pair of them, percent (median)
    max_drop_pct: float  # the drop an equally good retrain stays within (quality_calibration.py)


@dataclass
class QualityCalibration(Result):
    """How much each metric of a spec moves between retrains of a model on the user's data
    (components/release/quality/calibration.py): the limits a metric without its own then gets."""

    model: str
    versions: list[int]  # the retrains measured, published versions of the model
    eval_data: str = ""
    rows: int = 0
    metrics: dict[str, MetricVariation] = field(default_factory=dict)  # by the metric's report name
    recorded: str = ""  # when S3 took it (UTC)
    uri: str = ""


@dataclass
class QualityResult(Result):
    """The quality check's decision and its evidence: each metric for both versions over the labelled rows, overall
    and per slice, with the paired difference's interval, and every limit's effect (components/release/quality/quality.py)."""

    model: str
    version: int
    stable_version: int | None
    decision: VerdictName
    reasons: list[str]
    eval_data: str = ""
    rows: int = 0
    confidence: float = 0.0
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per metric and slice: values, difference, interval
    effects: list[dict[str, Any]] = field(default_factory=list)  # each limit's Effect, with the rows that would decide
    spec: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    stable_load_seconds: float = 0.0
    gate_wait_s: float = 0.0  # waited for the gate server while other releases measured there (gate_turn.py)
    calibration: QualityCalibration | None = None  # where metrics without limits took theirs from, if calibrated


# -------------------------------------------------------------------------------------------- gate
@dataclass
class GateCalibration(Result):
    """An equal candidate's noise on one gate server for one model (components/release/gate/calibration.py)."""

    model: str
    version: int  # the stable version, measured against its own published copy
    gate: str = ""
    rounds: int = 0
    round_seconds: float = 0.0  # one duet round, on average
    setup_seconds: float = 0.0  # loading both and warming up, which a gate's budget pays too
    p99_log_sd: float = 0.0  # the spread of the rounds' log(candidate p99 / stable p99)
    throughput_log_sd: float = 0.0
    budget_s: float = 0.0  # the budget the decidable limits are for
    decidable_pct: dict[str, float] = field(default_factory=dict)  # limit -> the smallest it decides, in %
    recorded: str = ""  # when S3 took it (UTC)
    uri: str = ""

    def rounds_within(self, budget_s: float) -> int:
        """The rounds a budget of `budget_s` holds at this gate's round length, after loading and warming up."""
        return max(0, int((budget_s - self.setup_seconds) // self.round_seconds)) if self.round_seconds > 0 else 0


@dataclass
class Attempt:
    """One perf_analyzer run of a gate round, as verdict.json lists every one (perf.PerfRun's figures)."""

    round: int
    attempt: int
    model: str
    version: str
    exit_code: int
    ok: bool
    reason: str
    seconds: float
    requests: int
    points: list[LoadPoint] = field(default_factory=list)
    stderr_tail: str = ""

    @classmethod
    def of(cls, number: int, attempt: int, run: perf.PerfRun) -> Attempt:
        """Attempt `attempt` of round `number`."""
        return cls(number, attempt, **{**run.to_dict(), "points": run.points})


@dataclass
class GateOutcome:
    """What the gate decided and how it measured: the fields its full result and its verdict share."""

    model: str
    version: int
    verdict: VerdictName
    reasons: list[str]
    stable_version: int | None = None  # none: a first release
    effects: list[Effect] = field(default_factory=list)  # each limit's estimate and interval
    rounds: int = 0
    stopped: str = ""  # why the gate stopped measuring
    attempts: list[Attempt] = field(default_factory=list)  # every perf_analyzer run
    measurement_seconds: float = 0.0
    stable_load_seconds: float = 0.0
    gate_wait_s: float = 0.0  # waited for the gate server while other releases measured there (gate_turn.py)
    gate_url: str = ""  # the gate server measured on (of several, the one the release staged on)
    calibration: GateCalibration | None = None  # this gate server's recorded noise for the model, if calibrated
    settings: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] | None = None  # the tune step's result (TuneResult's JSON)
    server: dict[str, Any] = field(default_factory=dict)  # the gate server's GPU/CPU figures while measuring
    quality: QualityResult | None = None  # the quality check on labelled data, when the release has one
    speed_verdict: VerdictName | None = None  # the speed measurement's own verdict, before quality is folded in

    def effect(self, name: str) -> Effect | None:
        return next((e for e in self.effects if e.name == name), None)

    @property
    def p99_regression_pct(self) -> float | None:
        found = self.effect("p99")
        return None if found is None else found.estimate * 100

    @property
    def throughput_regression_pct(self) -> float | None:
        found = self.effect("throughput")
        return None if found is None else -found.estimate * 100


@dataclass
class Verdict(GateOutcome, Result):
    """verdict.json: the gate's decision and its evidence, as the next steps and people read it."""

    candidate_summary: dict[str, Any] = field(default_factory=dict)
    stable_summary: dict[str, Any] = field(default_factory=dict)
    candidate_rounds: list[RoundFigures] = field(default_factory=list)
    stable_rounds: list[RoundFigures] = field(default_factory=list)

    def derived(self) -> dict[str, Any]:
        return {
            "p99_regression_pct": self.p99_regression_pct,
            "throughput_regression_pct": self.throughput_regression_pct,
        }


@dataclass
class GateResult(GateOutcome):
    """The gate's full result while it measures: every round's latencies; written as a `Verdict`."""

    candidate: Rounds = field(default_factory=Rounds)
    stable: Rounds = field(default_factory=Rounds)

    def as_verdict(self) -> Verdict:
        return Verdict(
            **{f.name: getattr(self, f.name) for f in fields(GateOutcome)},
            candidate_summary=self.candidate.summary(),
            stable_summary=self.stable.summary(),
            candidate_rounds=self.candidate.per_round(),
            stable_rounds=self.stable.per_round(),
        )

    def to_json(self) -> str:
        return self.as_verdict().to_json()
