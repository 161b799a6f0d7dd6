"""The quality spec: which metrics judge a release on labelled data, and each one's limits (YAML or JSON).

    slice: segment                    # optional: a column of the evaluation data that names a user segment
    metrics:
      - metric: hit_rate              # built in: hit_rate, ndcg, mrr (over a top-k output of item ids),
        k: 10                         #   accuracy, log_loss, auc (classification), mae, rmse (regression)
        output: topk_indices
        label: next_item
        max_drop: 0.02                # the largest drop allowed against stable, in the metric's own unit
        max_drop_pct: 3               #   and relative to stable's value, percent
        floor: 0.30                   # an absolute limit on the candidate's own value (all a first release has)
        per_slice: true               # the same limits on every slice too
      - metric: mypackage.metrics:coverage    # a user metric: module:function, one value per row
        outputs: [topk_indices]
        labels: [next_item]
        higher_is_better: true
        max_drop_pct: 5

A metric without any limit gets `max_drop_pct` DEFAULT_QUALITY_MAX_DROP_PCT. For a metric where lower is better
(log_loss, mae, rmse, or a user metric that says so) the absolute limit is `ceiling`, not `floor`.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from components.errors import TritonshipError
from components.model.signature import Signature
from components.settings import DEFAULT_QUALITY_MAX_DROP_PCT
from components.settings_model import StepSettings, setting, step_settings

RANKING = ("hit_rate", "ndcg", "mrr")
CLASSIFICATION = ("accuracy", "log_loss", "auc")
REGRESSION = ("mae", "rmse")
BUILT_IN = RANKING + CLASSIFICATION + REGRESSION
LOWER_IS_BETTER = ("log_loss", "mae", "rmse")


class QualitySpecError(TritonshipError):
    """The quality spec is wrong, or does not fit the model it judges."""


class MetricSpec(BaseModel):
    """One metric and its limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(description="a built-in metric's name, or module:function for a user metric")
    name: str = Field("", description="the name reports use; default: the metric's (with @k)")
    output: str = Field("", description="the output a built-in metric reads")
    label: str = Field("", description="the label column a built-in metric reads")
    k: int | None = Field(None, ge=1, description="ranking metrics: the cut-off (default: the output's width)")
    outputs: list[str] = Field(default_factory=list, description="a user metric's outputs")
    labels: list[str] = Field(default_factory=list, description="a user metric's label columns")
    higher_is_better: bool | None = Field(None, description="a user metric's direction")
    from_logits: bool = Field(False, description="log_loss, auc: the output holds logits, not probabilities")
    max_drop: float | None = Field(None, gt=0, description="the largest drop allowed against stable, in its unit")
    max_drop_pct: float | None = Field(None, gt=0, description="the largest drop allowed against stable, percent")
    floor: float | None = Field(None, description="the lowest value the candidate may have (higher is better)")
    ceiling: float | None = Field(None, description="the highest value the candidate may have (lower is better)")
    per_slice: bool = Field(False, description="apply the limits to every slice too")

    @model_validator(mode="after")
    def _check(self) -> MetricSpec:
        user = self.metric not in BUILT_IN
        if user and ":" not in self.metric:
            raise ValueError(
                f"metric {self.metric!r} is neither built in ({', '.join(BUILT_IN)}) nor a user metric "
                "written module:function"
            )
        if user and (not self.outputs or self.higher_is_better is None):
            raise ValueError(f"the user metric {self.metric} needs outputs: [...] and higher_is_better: true|false")
        if not user and (not self.output or not self.label):
            raise ValueError(f"the metric {self.metric} needs output: and label:")
        if not user and self.higher_is_better is not None and self.higher_is_better != self.better_high:
            raise ValueError(f"{self.metric} is built in: higher_is_better is its own, not to be set")
        if self.k is not None and self.metric not in RANKING:
            raise ValueError(f"k is for the ranking metrics ({', '.join(RANKING)}), not {self.metric}")
        if self.better_high and self.ceiling is not None:
            raise ValueError(f"{self.label_text}: higher is better, so its absolute limit is floor:, not ceiling:")
        if not self.better_high and self.floor is not None:
            raise ValueError(f"{self.label_text}: lower is better, so its absolute limit is ceiling:, not floor:")
        return self

    @property
    def is_user(self) -> bool:
        return self.metric not in BUILT_IN

    @property
    def better_high(self) -> bool:
        if self.is_user:
            return bool(self.higher_is_better)
        return self.metric not in LOWER_IS_BETTER

    @property
    def label_text(self) -> str:
        if self.name:
            return self.name
        if self.is_user:
            return self.metric.rsplit(":", 1)[-1]
        return f"{self.metric}@{self.k}" if self.k else self.metric

    @property
    def read_outputs(self) -> list[str]:
        return self.outputs if self.is_user else [self.output]

    @property
    def read_labels(self) -> list[str]:
        return self.labels if self.is_user else [self.label]

    @property
    def has_limits(self) -> bool:
        return not (self.max_drop_pct is None and self.max_drop is None and self.floor is None and self.ceiling is None)

    @property
    def relative_limit_pct(self) -> float | None:
        """max_drop_pct, or the default when no limit at all is set."""
        return self.max_drop_pct if self.has_limits else DEFAULT_QUALITY_MAX_DROP_PCT

    @property
    def absolute_limit(self) -> float | None:
        return self.floor if self.better_high else self.ceiling


class QualitySpec(BaseModel):
    """Every metric that judges a release, with its limits, and the optional slice column."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: list[MetricSpec] = Field(min_length=1)
    slice: str = Field("", description="a column of the evaluation data naming each row's segment")

    @model_validator(mode="after")
    def _unique(self) -> QualitySpec:
        names = [m.label_text for m in self.metrics]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"metric names must differ; give each a name: ({', '.join(repeated)})")
        return self

    @classmethod
    def from_text(cls, text: str, source: str = "the quality spec") -> QualitySpec:
        """From YAML or JSON text; a QualitySpecError naming the first problem."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise QualitySpecError(f"{source} is not valid YAML/JSON: {str(exc).splitlines()[0]}.") from None
        if not isinstance(data, dict):
            raise QualitySpecError(
                f"{source} must be a mapping with metrics: [...] (README, Quality on labelled data)."
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            message = first["msg"].removeprefix("Value error, ")
            raise QualitySpecError(f"{source}: {where + ': ' if where else ''}{message}.") from None

    @classmethod
    def load(cls, path: str | Path) -> QualitySpec:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise QualitySpecError(
                f"the quality spec {path} cannot be read ({getattr(exc, 'strerror', None) or 'not text'}); "
                "give a YAML or JSON file."
            ) from None
        return cls.from_text(text, f"the quality spec {path}")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(exclude_defaults=True))

    @property
    def label_columns(self) -> list[str]:
        return sorted({c for m in self.metrics for c in m.read_labels})

    def check_against(self, signature: Signature) -> None:
        """Every output a metric reads is one the model has, and the label columns do not shadow inputs."""
        outputs = {s.name: s for s in signature.outputs}
        inputs = {s.name for s in signature.inputs}
        for metric in self.metrics:
            for name in metric.read_outputs:
                if name not in outputs:
                    raise QualitySpecError(
                        f"the metric {metric.label_text} reads the output '{name}', which the model does not have "
                        f"(its outputs: {', '.join(outputs)}); name one of them."
                    )
            shadowed = sorted(set(metric.read_labels) & inputs)
            if shadowed:
                raise QualitySpecError(
                    f"the metric {metric.label_text} names the input {shadowed[0]} as a label; labels are columns "
                    "of their own."
                )
        if self.slice and self.slice in inputs | set(self.label_columns):
            raise QualitySpecError(f"the slice column '{self.slice}' is also an input or a label; give it its own.")


def spec_from_argument(value: str) -> QualitySpec:
    """A pipeline's or CLI's spec: a path to a YAML/JSON file, or the spec's text itself."""
    stripped = value.strip()
    if "\n" in stripped or stripped.startswith(("{", "metrics:")):
        return QualitySpec.from_text(stripped)
    return QualitySpec.load(stripped)


def spec_outputs(spec: QualitySpec) -> list[str]:
    """The outputs any metric reads, in a stable order."""
    return list(dict.fromkeys(name for m in spec.metrics for name in m.read_outputs))


@step_settings("quality")
class QualitySettings(StepSettings):
    """The quality check's inputs: the labelled data and the spec, checked together (components/release/quality/quality.py)."""

    eval_data: Annotated[
        str,
        setting("labelled evaluation data for the quality check: a path or s3:// URI, .parquet or .npz; empty: none"),
    ] = ""
    quality_spec: Annotated[
        str, setting("the quality check's metrics and limits: YAML or JSON text, or a file's path")
    ] = ""

    @model_validator(mode="after")
    def _given_together(self) -> QualitySettings:
        if self.eval_data and not self.quality_spec:
            raise ValueError("{eval_data} is given without {quality_spec}; give the metrics")
        if self.quality_spec and not self.eval_data:
            raise ValueError("{quality_spec} is given without {eval_data}; give the data")
        if self.quality_spec:
            try:
                _ = self.spec  # parsed here, once: the step reads this parse
            except QualitySpecError as exc:
                raise ValueError(str(exc)) from None
        return self

    @cached_property
    def spec(self) -> QualitySpec:
        return spec_from_argument(self.quality_spec)

    @property
    def enabled(self) -> bool:
        return bool(self.eval_data)
