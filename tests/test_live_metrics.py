"""The canary's p99 from Triton's latency histograms (26.01 and later): read from the metrics text, subtracted
between two readings, pooled over replicas, and judged at any round length, where a summary's p99 is judged
only with rounds as long as its window.

No Triton here exports histograms (the embedded 2.51 has none), so the metrics text below is written in the
exposition format of Triton's metrics guide (`nv_inference_first_response_histogram_ms`, `le` buckets in ms),
with the buckets this project gives a model's config."""

from __future__ import annotations

import numpy as np
import pytest

from components.model import model_config
from components.release.promote.canary import effects
from components.release.promote.records import Side
from components.release.promote.settings import CanarySettings
from components.serving.live_metrics import Counts, Histogram, parse

BOUNDS = (*model_config.LATENCY_BUCKETS_MS, float("inf"))


def _histogram(latencies_ms: np.ndarray) -> Histogram:
    return Histogram(BOUNDS, tuple(float(np.sum(latencies_ms <= b)) for b in BOUNDS))


def _text(model: str, version: int, latencies_ms: np.ndarray, success: int) -> str:
    lines = [
        "# HELP nv_inference_request_success Number of successful inference requests, all batch sizes",
        "# TYPE nv_inference_request_success counter",
        f'nv_inference_request_success{{model="{model}",version="{version}"}} {success}',
        "# HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds",
        "# TYPE nv_inference_first_response_histogram_ms histogram",
    ]
    for bound, count in zip(BOUNDS, _histogram(latencies_ms).counts, strict=True):
        le = "+Inf" if np.isinf(bound) else repr(bound)
        lines.append(
            f'nv_inference_first_response_histogram_ms_bucket{{model="{model}",version="{version}",le="{le}"}} {count:g}'
        )
    lines.append(
        f'nv_inference_first_response_histogram_ms_count{{model="{model}",version="{version}"}} {len(latencies_ms)}'
    )
    lines.append(
        f'nv_inference_first_response_histogram_ms_sum{{model="{model}",version="{version}"}} {latencies_ms.sum():g}'
    )
    return "\n".join(lines) + "\n"


def test_a_histogram_is_read_per_model_version_and_its_round_is_the_difference_of_two_readings():
    rng = np.random.default_rng(0)
    first, second = rng.lognormal(0.5, 0.3, 500), rng.lognormal(1.5, 0.3, 800)  # the second round 2.7x slower
    before = parse("m:8002", _text("m", 2, first, 500)).counts("m", 2)
    after = parse("m:8002", _text("m", 2, np.concatenate([first, second]), 1300)).counts("m", 2)
    assert before.histogram.bounds == BOUNDS and before.histogram.counts[-1] == 500
    round_ = after.since(before)
    assert round_.success == 800 and round_.histogram.counts[-1] == 800
    # the round's own p99, not the first reading's: within the bucket's fifth of the exact one
    assert round_.histogram.quantile_ms(0.99) == pytest.approx(np.percentile(second, 99), rel=0.2)
    assert (
        after.since(parse("m:8002", _text("m", 2, np.concatenate([first, second, second]), 2100)).counts("m", 2))
        is None
    )


def test_a_quantile_falls_within_its_bucket_and_an_empty_histogram_has_none():
    latencies = np.random.default_rng(1).lognormal(0.0, 0.8, 20_000)
    found = _histogram(latencies).quantile_ms(0.99)
    assert found == pytest.approx(np.percentile(latencies, 99), rel=0.05)
    assert Histogram(BOUNDS, (0.0,) * len(BOUNDS)).quantile_ms(0.99) is None
    beyond = Histogram((1.0, 2.0, float("inf")), (0.0, 0.0, 10.0))  # every request past the last finite bound
    assert beyond.quantile_ms(0.99) == 2.0


def test_replicas_pool_their_counts_and_a_side_prefers_the_histogram_to_the_summary():
    rng = np.random.default_rng(2)
    fast, slow = rng.lognormal(0.0, 0.2, 900), rng.lognormal(1.0, 0.2, 100)
    deltas = [Counts(900, 0, 900_000, 5_000.0, _histogram(fast)), Counts(100, 0, 300_000, 9_000.0, _histogram(slow))]
    side = Side.pooled(deltas)
    assert side.p99_from == "histogram"
    assert side.p99_ms == pytest.approx(np.percentile(np.concatenate([fast, slow]), 99), rel=0.2)
    summary = Side.pooled([Counts(900, 0, 900_000, 5_000.0), Counts(100, 0, 300_000, 9_000.0)])
    assert (summary.p99_from, summary.p99_ms) == ("summary", pytest.approx(5.4))  # request-weighted
    other_buckets = Histogram((1.0, float("inf")), (50.0, 100.0))
    mixed = Side.pooled([deltas[0], Counts(100, 0, 300_000, 9_000.0, other_buckets)])
    assert mixed.p99_from == "summary"  # unlike buckets are not pooled


def test_a_histogram_p99_decides_with_short_rounds_and_a_summary_p99_does_not():
    settings = CanarySettings(round_s=1.0, max_bake_s=30.0, max_latency_regression_pct=None)
    assert not settings.p99_decides

    def rounds(p99_canary: float, source: str) -> list[tuple[Side, Side]]:
        return [
            (Side(100, 0, 2.0, p99_canary * (1 + i / 100), source), Side(100, 0, 2.0, 4.0, source)) for i in range(6)
        ]

    histogram = effects(rounds(8.0, "histogram"), rounds(4.0, "histogram"), settings)
    p99 = next(e for e in histogram if e.name == "p99")
    assert p99.estimate == pytest.approx(1.0, abs=0.05) and p99.status == "beyond"
    assert "p99" not in {e.name for e in effects(rounds(8.0, "summary"), rounds(4.0, "summary"), settings)}


def test_a_config_given_buckets_carries_them_in_its_text():
    config = model_config.with_latency_buckets(model_config.mc.ModelConfig(name="m"))
    again = model_config.parse_pbtxt(model_config.to_pbtxt(model_config.with_latency_buckets(config)), "config.pbtxt")
    (control,) = again.model_metrics.metric_control
    assert control.metric_identifier.family == "nv_inference_first_response_histogram_ms"
    assert tuple(control.histogram_options.buckets) == model_config.LATENCY_BUCKETS_MS


def test_a_server_without_histograms_is_told_apart_from_one_with_them():
    with_them = parse("m:8002", _text("m", 1, np.array([1.0, 2.0]), 2))
    without = parse("m:8002", _text("m", 1, np.array([1.0, 2.0]), 2).split("# HELP nv_inference_first")[0])
    assert with_them.has_histograms and not without.has_histograms
    assert without.counts("m", 1).histogram is None and with_them.counts("m", 1).histogram is not None
