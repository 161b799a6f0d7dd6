"""The tune step: the coordinate search on known response surfaces, then for real on the embedded stack
(config overrides on the gate, perf_analyzer, the chosen settings promoted into production)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from components.model import model_config
from components.model.model_config import ServingSettings
from components.model.signature import Signature
from components.release.gate.gate import gate
from components.release.promote.promote import promote
from components.release.publish import publish
from components.release.results import Trial, TuneResult
from components.release.run_context import RunContext
from components.release.stage import stage
from components.release.tune.tune import TuneSettings, _on_gpu, grid, knobs, search, tune
from components.repository import ModelRepository
from components.serving import perf
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import RELAXED_STABILITY_PCT
from tests.models import MLP_SIGNATURE, mlp_folder
from tests.release_helpers import ABSOLUTE_GATE, NO_CANARY, replicas, repository, unique

DEFAULT = ServingSettings(max_batch_size=32, dynamic_batching=True, max_queue_delay_us=0, instance_count=1)
# the search's rules on the knobs every model has; the intra-op threads have a test of their own
SPACE = TuneSettings(
    load=perf.LoadSettings(concurrency=4, stability_pct=RELAXED_STABILITY_PCT),
    instance_counts=(1, 2, 3),
    intra_op_thread_counts=(1,),
    optimized_executions=(True,),
    queue_delays_us=(0, 500, 2000, 8000),
    budget=40,
)


def surface(throughput, p99=lambda s: 1.0):
    """A measure() over a known surface; records what was measured."""
    measured = []

    def measure(settings: ServingSettings) -> Trial:
        measured.append(settings)
        return Trial(settings, throughput(settings), p99(settings))

    return measure, measured


def test_the_grid_holds_every_combination_once():
    points = grid(DEFAULT, SPACE)
    # instances 3 x max batch {1, 32} (4, 16 and 32 hold the 4 in flight alike) x delays 4 x preferred {none,
    # what the load fills}
    assert len(points) == 3 * 2 * 4 * 2 == len(set(points))
    assert {p.max_batch_size for p in points} == {1, 32}
    assert DEFAULT in points
    in_flight = SPACE.load.concurrency  # 4 requests of batch 1
    assert all(p.preferred_batch_sizes in ((), (min(in_flight, p.max_batch_size),)) for p in points)
    unbatched = dataclasses.replace(DEFAULT, max_batch_size=None, dynamic_batching=False)
    assert [name for name, _ in knobs(unbatched, SPACE)] == ["instance_count"]


def test_no_more_instances_are_tried_than_requests_in_flight_at_the_tuning_load():
    one_in_flight = dataclasses.replace(SPACE, load=dataclasses.replace(SPACE.load, concurrency=1))
    ensemble = dataclasses.replace(DEFAULT, step_instance_count=1)
    tried = {
        name: {(s.instance_count, s.step_instance_count) for s in values(ensemble)}
        for name, values in knobs(ensemble, one_in_flight)
    }
    assert tried["instance_count"] == {(1, 1)} and tried["step_instance_count"] == {(1, 1)}
    two = dataclasses.replace(DEFAULT, instance_count=2)  # a count given stays among the values
    assert {s.instance_count for s in dict(knobs(two, one_in_flight))["instance_count"](two)} == {1, 2}
    at_a_rate = dataclasses.replace(SPACE, load=dataclasses.replace(SPACE.load, concurrency=1, request_rate=500.0))
    assert {s.instance_count for s in dict(knobs(DEFAULT, at_a_rate))["instance_count"](DEFAULT)} == {1, 2, 3}


def test_max_batch_sizes_the_requests_in_flight_cannot_fill_are_not_tried():
    def sizes(default: ServingSettings, settings: TuneSettings) -> set[int | None]:
        return {s.max_batch_size for s in dict(knobs(default, settings))["max_batch_size"](default)}

    one_in_flight = dataclasses.replace(SPACE, load=dataclasses.replace(SPACE.load, concurrency=1))
    assert sizes(DEFAULT, one_in_flight) == {32}  # every size serves batches of 1: nothing to tune
    assert sizes(DEFAULT, SPACE) == {1, 32}  # 4 in flight: only a size below 4 batches differently
    many = dataclasses.replace(SPACE, load=dataclasses.replace(SPACE.load, concurrency=64))
    assert sizes(DEFAULT, many) == {1, 4, 16, 32}
    at_a_rate = dataclasses.replace(SPACE, load=dataclasses.replace(SPACE.load, concurrency=1, request_rate=500.0))
    assert sizes(DEFAULT, at_a_rate) == {1, 4, 16, 32}  # requests in flight unbounded


def test_an_ensembles_pre_post_steps_get_an_instance_count_of_their_own():
    ensemble = dataclasses.replace(DEFAULT, step_instance_count=1)
    assert [name for name, _ in knobs(ensemble, SPACE)] == [
        "instance_count",
        "step_instance_count",
        "max_batch_size",
        "batching",
    ]
    assert len(grid(ensemble, SPACE)) == 3 * len(grid(DEFAULT, SPACE))

    def throughput(s: ServingSettings) -> float:  # the steps' processes are the limit, not the model's
        return 1000 * min(10 * s.instance_count, s.step_instance_count)

    measure, _ = surface(throughput)
    result = search(measure, ensemble, SPACE, len(grid(ensemble, SPACE)))
    assert result.chosen.step_instance_count == 3 and result.chosen.instance_count == 1


def test_the_pytorch_backends_intra_op_threads_are_a_knob_of_cpu_models_only():
    space = dataclasses.replace(SPACE, intra_op_thread_counts=(1, 2))
    assert [name for name, _ in knobs(DEFAULT, space)] == [
        "instance_count",
        "intra_op_threads",
        "max_batch_size",
        "batching",
    ]
    assert len(grid(DEFAULT, space)) == 2 * len(grid(DEFAULT, SPACE))
    measure, _ = surface(lambda s: 1000 * s.intra_op_threads)  # two threads serve twice as fast
    assert search(measure, DEFAULT, space, len(grid(DEFAULT, space))).chosen.intra_op_threads == 2

    signature = Signature.from_dict(MLP_SIGNATURE)
    for gpu in (False, True):
        candidate = SimpleNamespace(config=model_config.build("m", signature, gpu=gpu), members={})
        assert _on_gpu(candidate) is gpu  # tune() then offers the GPU model's own count only


def test_the_torchscript_profiling_executor_is_a_knob_of_gpu_models_first_and_reaches_the_config():
    space = dataclasses.replace(SPACE, optimized_executions=(True, False))
    assert [name for name, _ in knobs(DEFAULT, space)][:2] == ["optimized_execution", "instance_count"]
    assert len(grid(DEFAULT, space)) == 2 * len(grid(DEFAULT, SPACE))
    measure, _ = surface(lambda s: 1000 * (1 + (not s.optimized_execution)))  # the pauses gone: twice as fast
    assert search(measure, DEFAULT, space, len(grid(DEFAULT, space))).chosen.optimized_execution is False

    config = model_config.build("m", Signature.from_dict(MLP_SIGNATURE), gpu=True)
    assert model_config.optimized_execution(config)  # the backend's default: the parameter is not written
    off = model_config.with_settings(config, dataclasses.replace(DEFAULT, optimized_execution=False))
    assert off.parameters["DISABLE_OPTIMIZED_EXECUTION"].string_value == "true"
    assert not model_config.optimized_execution(off)
    back = model_config.with_settings(off, DEFAULT)
    assert "DISABLE_OPTIMIZED_EXECUTION" not in back.parameters and model_config.optimized_execution(back)


@pytest.mark.parametrize("counts", ["0,2", "1,two", ""])
def test_the_cli_refuses_instance_counts_that_are_not_whole_numbers_of_one_or_more(counts, tmp_path):
    from typer.testing import CliRunner

    from pipelines.cli import app

    args = ["tune", "-r", "s3://b", "-m", "m", "--version", "1", "--gate", "127.0.0.1:9", "--out", str(tmp_path / "t")]
    result = CliRunner().invoke(app, [*args, "--instance-counts", counts])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # rich wraps the sentence in a box
    assert "--instance-counts must be whole numbers of 1 or more" in said
    assert not (tmp_path / "t").exists()


def test_search_finds_the_best_of_a_separable_surface_measuring_a_fraction_of_the_grid():
    def throughput(s: ServingSettings) -> float:
        return (
            1000 * (1 + 0.3 * (s.instance_count == 2)) * (1 + s.max_batch_size / 64) * (1 + s.max_queue_delay_us / 4000)
        )

    measure, measured = surface(throughput)
    result = search(measure, DEFAULT, SPACE, len(grid(DEFAULT, SPACE)))
    best = max(grid(DEFAULT, SPACE), key=throughput)
    assert throughput(result.chosen) == throughput(best)
    assert measured.count(DEFAULT) == 3  # twice for the limit's reference, once more beside the winner
    assert measured.count(result.chosen) == 2 and result.confirmation.startswith("confirmed")
    assert len(set(measured)) == len(measured) - 3 < len(grid(DEFAULT, SPACE)) / 3
    assert result.gain_pct == pytest.approx((throughput(result.chosen) / throughput(DEFAULT) - 1) * 100)


def test_search_finds_a_queue_delay_that_only_pays_with_a_preferred_batch_size():
    """The recommender on the embedded gate behaved like this (benchmarks/README.md): a queue delay alone
    costs throughput, a preferred batch size alone changes nothing, together they win."""

    def throughput(s: ServingSettings) -> float:
        if s.max_queue_delay_us and s.preferred_batch_sizes:
            return 2400.0
        return 1900.0 - s.max_queue_delay_us / 10

    measure, measured = surface(throughput)
    result = search(measure, DEFAULT, SPACE, len(grid(DEFAULT, SPACE)))
    assert throughput(result.chosen) == 2400 and result.chosen.preferred_batch_sizes == (4,)
    assert len(measured) < len(grid(DEFAULT, SPACE)) / 2  # 17 of the 48


def test_search_keeps_p99_within_the_limit_the_default_sets():
    # Longer queue delays raise throughput but also p99; the limit is the default's p99 + 10%.
    measure, _ = surface(lambda s: 1000 + s.max_queue_delay_us, lambda s: 1.0 + s.max_queue_delay_us / 1000)
    result = search(measure, DEFAULT, dataclasses.replace(SPACE, p99_slack_pct=10), 96)
    assert result.p99_limit_ms == pytest.approx(1.1)
    assert result.chosen.max_queue_delay_us == 0  # 500 us would make p99 1.5 ms


def test_a_derived_limit_comes_from_the_higher_of_two_default_measurements():
    """One low p99 reading of the default (noise) must not refuse settings no slower than the default."""
    default_p99 = iter([1.0, 1.5, 1.2])  # three runs of the same setting; a fourth would fail

    def measure(settings: ServingSettings) -> Trial:
        if settings == DEFAULT:
            return Trial(settings, 1000.0, next(default_p99))
        return Trial(settings, 1000.0 * settings.instance_count, 1.4)

    result = search(measure, DEFAULT, SPACE, 96)
    assert result.p99_limit_ms == pytest.approx(1.5 * 1.1)  # not 1.0 * 1.1, which 1.4 ms would exceed
    assert result.chosen.instance_count == 3
    assert [t.settings for t in result.trials[:2]] == [DEFAULT, DEFAULT]
    assert result.trial(DEFAULT).p99_ms == 1.5 and result.settings_measured == len(result.trials) - 3
    assert result.gain_pct == pytest.approx(200.0)


def test_search_ignores_gains_under_the_threshold_and_respects_the_budget():
    measure, measured = surface(lambda s: 1000 * (1 + 0.01 * s.instance_count))  # +1% per instance: noise
    assert search(measure, DEFAULT, SPACE, 96).chosen == DEFAULT
    measure, measured = surface(lambda s: float(s.instance_count + s.max_batch_size + s.max_queue_delay_us))
    result = search(measure, DEFAULT, dataclasses.replace(SPACE, budget=5), 96)
    assert len(measured) == 5 + 2 and len(result.trials) == 7  # the budget, then the winner and the default again


def test_a_winner_of_one_noisy_run_that_does_not_win_again_is_not_adopted():
    """What a demo run did: 3 instances measured +15% once, and 34% slower in the next release's tuning."""
    runs: dict[ServingSettings, int] = {}

    def measure(settings: ServingSettings) -> Trial:
        runs[settings] = runs.get(settings, 0) + 1
        lucky = settings.instance_count == 3 and runs[settings] == 1
        return Trial(settings, 1150.0 if lucky else 1000.0 - 200 * (settings.instance_count == 3), 1.0)

    result = search(measure, DEFAULT, SPACE, 96)
    assert result.chosen == DEFAULT and result.gain_pct == 0
    three = dataclasses.replace(DEFAULT, instance_count=3)
    assert runs[three] == 2 and [t.settings for t in result.trials[-2:]] == [three, DEFAULT]
    assert (
        result.confirmation.startswith("not confirmed") and "-2.5% throughput" in result.confirmation
    )  # (1150 + 800) / 2 against 1000


def test_a_winner_whose_p99_breaks_the_limit_when_measured_again_is_not_adopted():
    unbatched = dataclasses.replace(DEFAULT, max_batch_size=None, dynamic_batching=False)  # one knob: instances
    p99s = iter([1.0, 1.0, 1.05, 1.4, 1.0])  # default twice, 2 instances, then 2 instances and the default again

    def measure(settings: ServingSettings) -> Trial:
        return Trial(settings, 1000.0 * settings.instance_count, next(p99s))

    result = search(measure, unbatched, dataclasses.replace(SPACE, instance_counts=(1, 2)), 2)
    assert result.p99_limit_ms == pytest.approx(1.1) and len(result.trials) == 5
    assert result.chosen == unbatched and "p99 1.40 ms is over the limit" in result.confirmation


def test_a_winner_that_cannot_be_measured_again_is_not_adopted():
    runs: dict[ServingSettings, int] = {}

    def measure(settings: ServingSettings) -> Trial:
        runs[settings] = runs.get(settings, 0) + 1
        if settings.instance_count == 2 and runs[settings] == 2:
            return Trial(settings, problem="perf_analyzer: no valid requests")
        return Trial(settings, 1000.0 * settings.instance_count, 1.0)

    unbatched = dataclasses.replace(DEFAULT, max_batch_size=None, dynamic_batching=False)
    result = search(measure, unbatched, dataclasses.replace(SPACE, instance_counts=(1, 2)), 2)
    assert result.chosen == unbatched and "could not be measured again" in result.confirmation


def test_a_default_that_cannot_be_measured_is_kept():
    def measure(settings: ServingSettings) -> Trial:
        return Trial(settings, problem="perf_analyzer: no valid requests")

    result = search(measure, DEFAULT, SPACE, 96)
    assert result.chosen == DEFAULT and len(result.trials) == 1


def test_tune_result_round_trips_through_json():
    measure, _ = surface(lambda s: 1000.0 * s.instance_count)
    result = search(measure, DEFAULT, SPACE, 96)
    again = TuneResult.from_json(result.to_json())
    assert again.chosen == result.chosen and again.trials == result.trials and again.gain_pct == result.gain_pct


def _every_key(stack) -> list[str]:
    pages = stack.s3.client().get_paginator("list_objects_v2").paginate(Bucket=stack.bucket)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.mark.slow
def test_tune_on_the_gate_then_the_gate_reports_it_and_promote_writes_the_chosen_settings(tmp_path, stack):
    """For real: every setting is loaded on the gate as a config override and measured with perf_analyzer;
    S3 is not written until promotion, which puts the chosen settings into production's config.pbtxt. The gate's
    report and history carry the tuning table."""
    name = unique("tune")
    (tmp_path / "v1").mkdir()
    folder = mlp_folder(tmp_path / "v1", name)
    settings = TuneSettings(
        load=perf.LoadSettings(concurrency=4, window_ms=500, stability_pct=RELAXED_STABILITY_PCT),
        instance_counts=(1, 2),
        queue_delays_us=(0, 2000),
        budget=6,
        min_gain_pct=0,
    )
    version = publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder).version
    staged = stage(RunContext(repository(stack), name, version, stack.gate.replica, stack.s3))
    repo = ModelRepository(repository(stack), stack.s3)
    on_gate = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3)  # no metrics
    off = tune(on_gate, dataclasses.replace(settings, enabled=False))
    assert (off.trials, off.chosen, off.enabled) == ([], off.default, False)  # turned off: the default, unmeasured
    objects_before = _every_key(stack)

    result = tune(on_gate, settings)
    assert 2 <= len(result.trials) <= 6 + 2 and all(t.measured for t in result.trials), [
        t.problem for t in result.trials
    ]
    assert all(t.throughput > 0 and t.p99_ms > 0 for t in result.trials)
    # a run of the default warms the server up first and is kept apart from the trials it would skew
    assert result.warm_up.settings == result.default and result.warm_up.measured
    assert [t.settings for t in result.trials[:2]] == [result.default, result.default]
    cpu_space = dataclasses.replace(settings, optimized_executions=(True,))  # tune keeps a CPU model's executor
    assert result.grid_size == len(grid(result.default, cpu_space))
    # the candidate is left loaded with the chosen settings, as Triton reports them
    served = TritonAdmin(stack.gate.http_url).model_config(f"{name}__candidate")
    assert served["max_batch_size"] == result.chosen.max_batch_size
    assert served["instance_group"][0]["count"] == result.chosen.instance_count
    assert served["parameters"]["INTRA_OP_THREAD_COUNT"]["string_value"] == str(result.chosen.intra_op_threads)
    # the only S3 write was the history event
    objects_after = _every_key(stack)
    written = [k for k in objects_after if k not in objects_before]
    assert len(written) == 1 and written[0].startswith(f"history/{name}/") and written[0].endswith("-tuned.json")
    tuned_event = repo.history(name)[-1]
    assert tuned_event["event"] == "tuned" and len(tuned_event["trials"]) == len(result.trials)

    context = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), stack.s3)
    gate(context, ABSOLUTE_GATE, staged, tmp_path / "g", tuning=result)  # a first release: its absolute limit
    report = (tmp_path / "g" / "report.md").read_text()
    assert f"{result.settings_measured} of {result.grid_size} measured" in report
    rows = [line for line in report.splitlines() if line.startswith(("| 1 |", "| 2 |"))]  # instances first
    assert len(rows) >= len(result.trials) + 1 and "chosen" in report
    assert report.count("warm-up, not counted") == 1
    assert "Serving settings measured" in (tmp_path / "g" / "report.html").read_text()
    chosen_json = json.loads(json.dumps(dataclasses.asdict(result.chosen)))  # as JSON has it
    assert json.loads((tmp_path / "g" / "verdict.json").read_text())["tuning"]["chosen"] == chosen_json
    gate_event = repo.history(name)[-1]
    assert gate_event["event"] == "gate" and gate_event["serving"] == chosen_json

    # promotion writes the chosen settings (here forced to something recognisable) into production
    # (a smaller max_batch_size than the golden samples' rows: the smoke check must send smaller requests)
    chosen = dataclasses.replace(
        result.chosen,
        instance_count=2,
        max_queue_delay_us=1234,
        max_batch_size=2,
        preferred_batch_sizes=(),
        intra_op_threads=2,
        optimized_execution=False,
    )
    context = RunContext(repository(stack), name, version, stack.gate.replica, stack.s3)
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass", serving=chosen)
    desired = repo.desired_config(name)[0]
    assert desired.dynamic_batching.max_queue_delay_microseconds == 1234 and desired.instance_group[0].count == 2
    assert desired.parameters["INTRA_OP_THREAD_COUNT"].string_value == "2"
    for server in stack.replicas:
        config = TritonAdmin(server.http_url).model_config(name)
        assert config["instance_group"][0]["count"] == 2 and config["max_batch_size"] == 2
        assert config["parameters"]["INTRA_OP_THREAD_COUNT"]["string_value"] == "2"
        assert config["parameters"]["DISABLE_OPTIMIZED_EXECUTION"]["string_value"] == "true"
        assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1234
        assert TritonAdmin(server.http_url).served_version(name, {"x": np.ones((1, 16), np.float32)}, ["y"]) == 1
