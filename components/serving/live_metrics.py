"""What a production Triton says about the live requests a model has served: its metrics endpoint's counters
per model and version, read by promote's canary (components/release/promote/canary.py).

Triton counts every request of a model version since it was loaded: `nv_inference_request_success`,
`nv_inference_request_failure` (by reason) and `nv_inference_request_duration_us` (the time from the request's
arrival to its response, summed over successes). With `--metrics-config=summary_latencies=true` it also keeps
`nv_inference_request_summary_us`, quantiles over the last minute (prometheus-cpp's summary: 60 s in 5 buckets);
a server started without it gives no p99, which is then left out.

Triton 26.01 and later, with `--metrics-config=histogram_latencies=true`, also export
`nv_inference_first_response_histogram_ms` for every model (before, for decoupled ones only): cumulative counts
of requests per latency bucket, the buckets set per model in its config (`model_metrics`,
components/model/model_config.py). For a model that answers once, the first response is the response. A
histogram's counts subtract like the other counters, so the p99 of exactly one round, pooled over replicas, is
read from the difference of two readings: no minute-long window, no averaging of quantiles. The canary prefers
it where a server exports it. The text is parsed by prometheus_client."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import requests
from prometheus_client.parser import text_string_to_metric_families

from components.errors import TritonshipError
from components.model.model_config import LATENCY_HISTOGRAM
from components.serving.replicas import Replica

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
DURATION = "nv_inference_request_duration_us"
SUMMARY = "nv_inference_request_summary_us"
HISTOGRAM = LATENCY_HISTOGRAM


class MetricsUnavailable(TritonshipError):
    """A metrics endpoint did not answer, or answered with something that is not Prometheus text."""


@dataclass(frozen=True)
class Histogram:
    """Requests counted per latency bucket: `bounds` are the buckets' upper ends in ms (+inf last), `counts` the
    requests at or under each, cumulative as Prometheus keeps them."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    def since(self, earlier: Histogram) -> Histogram | None:
        if earlier.bounds != self.bounds:
            return None
        delta = tuple(now - then for now, then in zip(self.counts, earlier.counts, strict=True))
        return Histogram(self.bounds, delta) if min(delta, default=0) >= 0 else None

    @staticmethod
    def pooled(histograms: list[Histogram]) -> Histogram | None:
        """The sum over replicas; None when their buckets differ (their quantiles would not be comparable)."""
        if not histograms or len({h.bounds for h in histograms}) != 1:
            return None
        return Histogram(histograms[0].bounds, tuple(map(sum, zip(*(h.counts for h in histograms), strict=True))))

    def quantile_ms(self, q: float) -> float | None:
        """Prometheus's histogram_quantile: linear within the bucket that holds the q-th request; the highest finite
        bound when it falls in the +inf bucket; None with no request."""
        total = self.counts[-1] if self.counts else 0.0
        if total <= 0:
            return None
        rank, lower, below = q * total, 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            if count >= rank:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
            lower, below = bound, count
        return lower


@dataclass(frozen=True)
class Counts:
    """One model version's counters on one server at one moment (cumulative since it was loaded)."""

    success: float
    failure: float
    duration_us: float
    p99_us: float | None  # over the last minute, where the server keeps summaries
    histogram: Histogram | None = None  # where the server exports latency histograms

    def since(self, earlier: Counts) -> Counts | None:
        """What was served between `earlier` and this reading; None when a counter went back (the version was
        loaded again or the server restarted: its counters started from zero)."""
        delta = Counts(
            self.success - earlier.success, self.failure - earlier.failure, self.duration_us - earlier.duration_us, None
        )
        if min(delta.success, delta.failure, delta.duration_us) < 0:
            return None
        histogram = self.histogram.since(earlier.histogram) if self.histogram and earlier.histogram else None
        if (
            self.histogram
            and earlier.histogram
            and histogram is None
            and self.histogram.bounds == earlier.histogram.bounds
        ):
            return None  # its counts went back too
        return Counts(delta.success, delta.failure, delta.duration_us, self.p99_us, histogram)

    @property
    def requests(self) -> int:
        return int(self.success + self.failure)


@dataclass(frozen=True)
class Scrape:
    """One reading of a server's metrics endpoint: (family, model, version) -> value, and p99s."""

    url: str
    values: dict[tuple[str, str, str], float]
    histograms: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # (model, version) -> histogram

    @property
    def has_histograms(self) -> bool:
        return bool(self.histograms)

    def counts(self, model: str, version: int | None) -> Counts | None:
        """The version's counters (None: every version's, summed); None when the server reports none for it."""
        versions = [v for (name, m, v) in self.values if name == SUCCESS and m == model]
        if version is not None:
            versions = [v for v in versions if v == str(version)]
        if not versions:
            return None
        found = [self._one(model, v) for v in versions]
        busiest = max(found, key=lambda c: c.success)
        return Counts(
            sum(c.success for c in found),
            sum(c.failure for c in found),
            sum(c.duration_us for c in found),
            busiest.p99_us,
            Histogram.pooled([c.histogram for c in found if c.histogram]) if all(c.histogram for c in found) else None,
        )

    def _one(self, model: str, version: str) -> Counts:
        key = (model, version)
        p99 = self.values.get((f"{SUMMARY}:0.99", *key))
        return Counts(
            self.values[(SUCCESS, *key)],
            self.values.get((FAILURE, *key), 0.0),
            self.values.get((DURATION, *key), 0.0),
            p99 if p99 is not None and math.isfinite(p99) else None,  # NaN: nothing observed in the last minute
            self.histograms.get(key),
        )


def scrape(metrics_url: str, timeout: float = 5.0) -> Scrape:
    """Read the endpoint once; MetricsUnavailable, in one sentence, when it does not answer or is garbled."""
    url = metrics_url if metrics_url.startswith("http") else f"http://{metrics_url}/metrics"
    try:
        response = requests.get(url, timeout=timeout)
        response.raise_for_status()
    except requests.RequestException as exc:
        raise MetricsUnavailable(f"the metrics endpoint {url} did not answer ({type(exc).__name__})") from None
    return parse(url, response.text)


def parse(url: str, text: str) -> Scrape:
    """The counters of one reading's Prometheus text; MetricsUnavailable when it is not Prometheus text."""
    values: dict[tuple[str, str, str], float] = {}
    buckets: dict[tuple[str, str], dict[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.name == HISTOGRAM:
                for sample in family.samples:
                    if sample.name == f"{HISTOGRAM}_bucket" and {"model", "version", "le"} <= sample.labels.keys():
                        one = buckets.setdefault((sample.labels["model"], sample.labels["version"]), {})
                        one[float(sample.labels["le"])] = float(sample.value)
                continue
            if family.name not in (SUCCESS, FAILURE, DURATION, SUMMARY):
                continue
            for sample in family.samples:
                labels = sample.labels
                if "model" not in labels or "version" not in labels:
                    continue
                if family.name == SUMMARY:
                    if sample.name != SUMMARY or labels.get("quantile") != "0.99":
                        continue
                    name = f"{SUMMARY}:0.99"
                else:
                    name = family.name
                key = (name, labels["model"], labels["version"])
                values[key] = values.get(key, 0.0) + float(sample.value)  # failures come once per reason
    except ValueError as exc:
        raise MetricsUnavailable(
            f"the metrics endpoint {url} answered with text that is not Prometheus's ({exc})"
        ) from None
    histograms = {key: Histogram(tuple(sorted(b)), tuple(b[le] for le in sorted(b))) for key, b in buckets.items()}
    return Scrape(url, values, histograms)


def histograms_everywhere(replicas: list[Replica]) -> bool:
    """Whether every replica exports latency histograms (Triton 26.01 and later with histogram_latencies=true):
    only then may a config carry its buckets, which an older Triton refuses."""
    try:
        return all(r.metrics_url and scrape(r.metrics_url).has_histograms for r in replicas)
    except MetricsUnavailable:
        return False
