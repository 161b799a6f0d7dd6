"""The tune step at a fixed request rate: every setting that keeps up serves the rate alike, so the lowest p99
among them wins; on known response surfaces, then for real on the embedded stack."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from components.model.model_config import ServingSettings
from components.release.gate import report as gate_report
from components.release.publish import publish
from components.release.results import Trial, TuneResult
from components.release.run_context import RunContext
from components.release.stage import stage
from components.release.tune.tune import TuneSettings, grid, search, tune
from components.serving import perf
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import RELAXED_STABILITY_PCT, LoadSettings
from tests.models import mlp_folder
from tests.release_helpers import repository, unique
from tests.test_tune import DEFAULT, SPACE, surface

RATE = dataclasses.replace(SPACE, load=LoadSettings(request_rate=150, stability_pct=RELAXED_STABILITY_PCT))


def test_at_a_fixed_rate_the_lowest_p99_among_the_settings_that_keep_up_wins():
    """At a fixed rate every setting that keeps up serves the same throughput: 3 instances have the lowest
    p99 but fall behind the rate, 2 instances keep up 30% faster than the default."""

    def throughput(s: ServingSettings) -> float:
        return 100.0 if s.instance_count == 3 else 149.0

    def p99(s: ServingSettings) -> float:
        return {1: 1.0, 2: 0.7, 3: 0.5}[s.instance_count] + s.max_queue_delay_us / 1000

    measure, _ = surface(throughput, p99)
    result = search(measure, DEFAULT, RATE, len(grid(DEFAULT, RATE)))
    assert result.chosen == dataclasses.replace(DEFAULT, instance_count=2) and result.request_rate == 150
    assert result.gain_pct == pytest.approx(30.0)
    assert result.confirmation == "confirmed: +30.0% lower p99 at 150 requests/s over all runs of both"
    assert TuneResult.from_json(result.to_json()).gain_pct == pytest.approx(30.0)
    header = gate_report.tuning_markdown(json.loads(result.to_json()))[1]
    assert "p99 +30.0% lower than the default's at 150 requests/s" in header


def test_at_a_fixed_rate_no_single_step_keeps_up_but_a_combination_does():
    """None of 1-3 instances without a queue delay keeps up; the search goes on from the one that served most
    (3 instances) and finds that 3 instances with a delay keep up within the limit."""

    def throughput(s: ServingSettings) -> float:
        return 150.0 if s.instance_count == 3 and s.max_queue_delay_us else 60.0 + 20 * s.instance_count

    measure, _ = surface(throughput, lambda s: 0.8)
    space = dataclasses.replace(RATE, max_p99_ms=1.0)
    result = search(measure, DEFAULT, space, len(grid(DEFAULT, space)))
    assert result.chosen.instance_count == 3 and result.chosen.max_queue_delay_us > 0, result.chosen
    assert result.confirmation.startswith("confirmed")


def test_at_a_fixed_rate_a_winner_that_falls_behind_when_measured_again_is_not_adopted():
    runs: dict[ServingSettings, int] = {}

    def measure(settings: ServingSettings) -> Trial:
        runs[settings] = runs.get(settings, 0) + 1
        behind = settings.instance_count == 2 and runs[settings] == 2
        return Trial(settings, 120.0 if behind else 150.0, 0.5 if settings.instance_count == 2 else 1.0)

    unbatched = dataclasses.replace(DEFAULT, max_batch_size=None, dynamic_batching=False)
    result = search(measure, unbatched, dataclasses.replace(RATE, instance_counts=(1, 2)), 2)
    assert result.chosen == unbatched
    assert (
        result.confirmation
        == "not confirmed: measured again, it served 135 of the 150 requests/s offered; the default is kept"
    )


def test_at_a_fixed_rate_one_high_reading_of_the_default_does_not_confirm_a_winner():
    """The default runs three times and the winner twice: compared on their highest p99s, the default's one
    high reading (1.6 ms) would make a 5% difference look like 34%; on the means it is 15%, under 20%."""
    p99s = iter([1.0, 1.6, 1.0, 1.05, 1.0])  # default twice, 2 instances, then 2 instances and the default again

    def measure(settings: ServingSettings) -> Trial:
        return Trial(settings, 150.0, next(p99s))

    unbatched = dataclasses.replace(DEFAULT, max_batch_size=None, dynamic_batching=False)
    space = dataclasses.replace(RATE, instance_counts=(1, 2), min_gain_pct=20)
    result = search(measure, unbatched, space, 2)
    assert result.chosen == unbatched and len(result.trials) == 5
    assert "+14.6% lower p99 at 150 requests/s over all runs (under +20%)" in result.confirmation


def test_a_fixed_rate_gets_client_threads_enough_to_send_it():
    """perf_analyzer's own default, 4 threads, sends about 1,000 requests/s whatever the rate asked."""

    def threads(load: LoadSettings) -> str:
        args = perf._arguments("h:1", "m", Path("in.json"), load, "", Path("out"))
        return args[args.index("--max-threads") + 1]

    assert threads(LoadSettings(request_rate=10_000)) == "100"
    assert threads(LoadSettings(request_rate=50)) == "16"
    assert threads(LoadSettings(request_rate=10_000, max_threads=8)) == "8"
    assert "--max-threads" not in perf._arguments("h:1", "m", Path("in.json"), LoadSettings(), "", Path("o"))


def test_a_rate_beyond_one_process_of_synchronous_threads_is_shared_by_several():
    """256 synchronous threads carry 25,600 requests/s of up to 10 ms: 50,000/s over HTTP takes two processes of
    250 threads each; over gRPC one process sends it asynchronously (perf_analyzer's HTTP client holds each
    asynchronous request back until a response arrives)."""
    http = LoadSettings(request_rate=50_000)
    share = perf.per_client(http)
    args = perf._arguments("h:1", "m", Path("in.json"), share, "", Path("out"))
    assert perf.rate_clients(http) == 2 and share.request_rate == 25_000 and "--async" not in args
    assert args[args.index("--max-threads") + 1] == "250"
    grpc = LoadSettings(request_rate=50_000, protocol="grpc")
    args = perf._arguments("h:1", "m", Path("in.json"), perf.per_client(grpc), "", Path("out"))
    assert perf.rate_clients(grpc) == 1 and "--async" in args and args[args.index("--max-threads") + 1] == "10"
    assert perf.rate_clients(LoadSettings(request_rate=10_000)) == 1
    assert perf.per_client(LoadSettings(concurrency=4)) == LoadSettings(concurrency=4)
    # the gate's duet pins its clients to a quarter of the CPUs, unless the rate needs more CPUs than that
    assert perf.client_cpus_for(LoadSettings(request_rate=10_000), 2, {0, 1, 2, 3}) == {0, 1, 2, 3}
    assert perf.client_cpus_for(http, 1, {0, 1, 2, 3}) is None


def test_the_processes_sharing_a_rate_make_one_run():
    def run(start: int, latencies: list[float], throughput: float, exit_code: int = 0) -> perf.PerfRun:
        requests = perf.Requests(
            np.arange(start, start + len(latencies), dtype=np.int64), np.asarray(latencies), (start, start + 9)
        )
        point = perf.LoadPoint(100.0, throughput, 1, 1, 1, 1, 10.0, 20.0)
        return perf.PerfRun("m", "1", exit_code, [point] if exit_code == 0 else [], requests=requests)

    one = perf.merged([run(0, [1.0] * 99, 100.0), run(5, [1.0] * 98 + [50.0, 60.0], 300.0)])
    assert one.ok and one.points[0].throughput == 400.0 and one.points[0].concurrency == 200.0
    assert one.latencies_us.size == 199 and one.requests.span_ns == (5, 9)
    assert list(one.requests.start_ns) == sorted(one.requests.start_ns)
    assert one.points[0].p99_us > 1.0 and one.points[0].server_queue_us == 10.0
    broken = perf.merged([run(0, [1.0], 100.0), run(0, [1.0], 0.0, exit_code=2)])
    assert not broken.ok and broken.exit_code == 2


@pytest.mark.slow
def test_tune_at_a_request_rate_measures_every_setting_at_that_rate(stack, tmp_path):
    """For real, from the flat settings the CLI and the pipeline give: perf_analyzer sends the rate (the MLP
    serves thousands of requests/s at a concurrency, 150/s here), and a setting other than the default is
    chosen only for a p99 lower by the minimum gain."""
    name = unique("tunerate")
    (tmp_path / "v1").mkdir()
    version = publish(RunContext(repository(stack), "", s3=stack.s3), folder=mlp_folder(tmp_path / "v1", name)).version
    stage(RunContext(repository(stack), name, version, stack.gate.replica, stack.s3))
    settings = TuneSettings.from_flat(request_rate=150, window_ms=500, instance_counts="1,2", budget=3)
    on_gate = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3)  # no metrics
    result = tune(on_gate, settings)
    assert result.request_rate == 150 and result.trials
    assert all(t.measured and 140 <= t.throughput <= 160 for t in result.trials), [t.row() for t in result.trials]
    assert result.chosen == result.default or result.gain_pct >= settings.min_gain_pct
    TritonAdmin(stack.gate.http_url).unload(f"{name}__candidate")
