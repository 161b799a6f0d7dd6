"""The quality check on the real stack: the demo's BERT4Rec trained for real (pipelines/samples/bert4rec/training.py),
candidate and stable served side by side by Triton's PyTorch backend on the gate, judged on labelled sessions."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from components.errors import TritonshipError
from components.model import model_config
from components.release.gate.gate import gate
from components.release.promote.promote import PromotionError, promote, reject
from components.release.publish import publish
from components.release.quality.quality import quality
from components.release.quality.spec import QualitySettings, QualitySpec
from components.release.run_context import RunContext
from components.release.stage import stage
from components.release.tune.tune import default_settings
from components.repository import ModelRepository
from components.s3 import S3Settings
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from pipelines.demo import TRAINED, trained_checkpoint
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import training
from pipelines.samples.bert4rec.build import compiled_folder
from tests.release_helpers import ABSOLUTE_GATE, NO_CANARY, install_stable, replicas, repository, unique

REPO = Path(__file__).resolve().parents[1]
ROWS = 3000
HIT_RATE = {"metric": "hit_rate", "k": 10, "output": "topk_indices", "label": "next_item"}
SPEC = QualitySpec.model_validate({"metrics": [HIT_RATE | {"floor": 0.2, "max_drop_pct": 2}], "slice": "segment"})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """Checkpoints of the demo model trained on the same data with seeds 0 and 1, and on a corrupted log (for a
    third of the batches: it trains alone, after the other two, and is worse either way); the held-out eval set as
    Parquet and .npz."""
    where = tmp_path_factory.mktemp("trained")
    steps = {"corrupted": training.DEFAULT_STEPS // 3}
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:  # one thread each
        jobs = [pool.submit(trained_checkpoint, k, *job, where, steps.get(k)) for k, job in TRAINED.items()]
        paths = {label: job.result()[0] for label, job in zip(TRAINED, jobs, strict=True)}
    data = training.eval_set(ROWS, seed=1000)
    for suffix in ("parquet", "npz"):
        training.write_eval(data, where / f"eval.{suffix}")
        paths[suffix] = where / f"eval.{suffix}"
    return paths


def _folder(tmp_path: Path, name: str, checkpoint: Path, sub: str) -> Path:
    (tmp_path / sub).mkdir()
    return compiled_folder("demo_v1", bert4rec.DYNAMIC_SIGNATURE, tmp_path / sub / name, checkpoint=checkpoint)


def _staged(stack, folder: Path) -> int:
    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder)
    assert stage(
        RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3),
    ).accuracy_passed
    return published.version


def _check(stack, name: str, version: int, data: Path | str, spec: QualitySpec = SPEC, s3: S3Settings | None = None):
    context = RunContext(repository(stack), name, version, Replica("gate", stack.gate.http_url), s3 or stack.s3)
    return quality(context, QualitySettings(eval_data=str(data), quality_spec=spec.to_json()))


@pytest.mark.slow
def test_a_first_release_is_held_to_its_floor_then_equal_retrains_pass_and_a_degraded_one_fails(
    tmp_path, stack, trained
):
    name = unique("q")
    first_folder = _folder(tmp_path, name, trained["seed0"], "v1")
    v1 = _staged(stack, first_folder)
    first = _check(stack, name, v1, trained["parquet"])
    assert first.decision == "pass" and first.stable_version is None, first.reasons
    assert [e["name"] for e in first.effects] == ["hit_rate@10"]  # the floor alone: nothing to compare with
    whole = next(m for m in first.metrics if m["slice"] == "")
    assert whole["candidate"] > 0.3 > 10 / bert4rec.DEMO.items  # trained: far above chance
    assert {m["slice"] for m in first.metrics} == {"", "head", "tail"}
    too_high = QualitySpec.model_validate({"metrics": [HIT_RATE | {"floor": 0.99}], "slice": "segment"})
    assert _check(stack, name, v1, trained["npz"], too_high).decision == "fail"
    # stable serves smaller batches than the candidate's 16, as tuning may choose: each request must fit both
    built = default_settings(model_config.parse_pbtxt((first_folder / "config.pbtxt").read_text()))
    assert built.max_batch_size == 16
    smaller = dataclasses.replace(built, max_batch_size=4)
    context = RunContext(repository(stack), name, v1, stack.gate.replica, stack.s3)
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass", serving=smaller)
    assert ModelRepository(repository(stack), stack.s3).desired_config(name)[0].max_batch_size == 4

    v2 = _staged(stack, _folder(tmp_path, name, trained["seed1"], "v2"))  # another seed, same data
    equal = _check(stack, name, v2, trained["npz"])
    assert equal.decision == "pass", equal.reasons
    assert equal.stable_version == v1 and not TritonAdmin(stack.gate.http_url).is_ready(name)  # stable unloaded
    same_from_parquet = _check(stack, name, v2, trained["parquet"])
    assert same_from_parquet.metrics == equal.metrics  # the same rows in either format, the same figures
    context = RunContext(repository(stack), name, v2, stack.gate.replica, stack.s3)
    reject(context, "pass", ["only the quality check was the subject"])

    v3 = _staged(stack, _folder(tmp_path, name, trained["corrupted"], "v3"))  # as fast, as faithful, worse
    degraded = _check(stack, name, v3, trained["parquet"])
    assert degraded.decision == "fail", degraded.reasons
    verdict = gate(
        RunContext(repository(stack), name, v3, Replica("gate", stack.gate.http_url), stack.s3),
        ABSOLUTE_GATE,  # its speed is not the subject: as fast, and so passed on a busy machine too
        out_dir=tmp_path / "gate",
        quality=degraded,
    )
    assert verdict.speed_verdict == "pass" and verdict.verdict == "fail", verdict.reasons
    assert any(r.startswith("quality: hit_rate@10 change") and r.endswith("beyond") for r in verdict.reasons)
    saved = json.loads((tmp_path / "gate" / "verdict.json").read_text())
    assert saved["quality"]["decision"] == "fail" and saved["speed_verdict"] == "pass"
    assert "## Quality: **FAIL**" in (tmp_path / "gate" / "report.md").read_text()
    assert (tmp_path / "gate" / "quality.png").stat().st_size > 0
    with pytest.raises(PromotionError, match="quality"):
        context = RunContext(repository(stack), name, v3, stack.gate.replica, stack.s3)
        promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass", quality="fail")
    request = training.eval_set(1, seed=5)
    inputs = {k: request[k] for k in ("item_ids", "mask_pos")}
    assert [TritonAdmin(s.http_url).served_version(name, inputs, ["topk_indices"]) for s in stack.replicas] == [v1] * 2


def _eval_file(tmp_path: Path, label: str, change) -> Path:
    data = training.eval_set(200, seed=1000)
    change(data)
    path = tmp_path / f"{label}.parquet"
    training.write_eval(data, path)
    return path


def raising_metric(outputs, labels):
    raise ValueError("no such thing as a free recommendation")


@pytest.mark.slow
def test_bad_evaluation_data_or_metrics_are_one_sentence_and_leave_stable_serving(tmp_path, stack, trained):
    """Each bad input: a plain error naming it, the candidate still staged, the stable version serving in production
    and not left loaded on the gate; one of them through the CLI, which exits non-zero with that sentence."""
    name = unique("qbad")
    v1 = install_stable(stack, _folder(tmp_path, name, trained["seed0"], "v1"))
    v2 = _staged(stack, _folder(tmp_path, name, trained["seed1"], "v2"))
    empty = tmp_path / "empty.parquet"
    training.write_eval({k: v[:0] for k, v in training.eval_set(2, seed=1).items()}, empty)
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(trained["parquet"].read_bytes()[:300])
    cases = {
        "a missing column": (
            _eval_file(tmp_path, "missing", lambda d: d.pop("next_item")),
            SPEC,
            "no column next_item",
        ),
        "an extra column": (_eval_file(tmp_path, "extra", lambda d: d.update(user=d["next_item"])), SPEC, "user"),
        "a wrong dtype": (
            _eval_file(tmp_path, "dtype", lambda d: d.update(item_ids=d["item_ids"].astype(np.int32))),
            SPEC,
            "holds int32",
        ),
        "a wrong shape": (
            _eval_file(tmp_path, "shape", lambda d: d.update(item_ids=np.tile(d["item_ids"], 3))),
            SPEC,
            "outside the served range",
        ),
        "labels outside the output's range": (
            _eval_file(tmp_path, "labels", lambda d: d.update(next_item=d["next_item"] + 1000)),
            SPEC,
            "outside [1, 501)",
        ),
        "no rows": (empty, SPEC, "no rows"),
        "corrupt data": (corrupt, SPEC, "cannot be read as parquet"),
        "a missing object": (f"s3://{stack.bucket}/eval/none.parquet", SPEC, "does not exist"),
        "a metric on an output the model lacks": (
            trained["parquet"],
            QualitySpec.model_validate({"metrics": [HIT_RATE | {"output": "scores"}], "slice": "segment"}),
            "does not have",
        ),
        "a user metric that raises": (
            trained["parquet"],
            QualitySpec.model_validate(
                {
                    "metrics": [
                        {
                            "metric": f"{__name__}:raising_metric",
                            "outputs": ["topk_indices"],
                            "labels": ["next_item"],
                            "higher_is_better": True,
                        }
                    ],
                    "slice": "segment",
                }
            ),
            "raised ValueError: no such thing",
        ),
    }
    for case, (data, spec, said) in cases.items():
        with pytest.raises(TritonshipError, match=re.escape(said)) as caught:
            _check(stack, name, v2, data, spec)
        assert "\n" not in str(caught.value) and "Traceback" not in str(caught.value), case
        _assert_stable_serving(stack, name, v1, v2)
    unreachable = S3Settings(
        "http://127.0.0.1:9", stack.s3.region, stack.s3.access_key_id, stack.s3.secret_access_key, 1
    )
    denied = S3Settings(stack.s3.endpoint_url, stack.s3.region, "AKIAIOSFODNN7EXAMPLE", "not-the-secret", 1)
    stack.s3.client().upload_file(str(trained["parquet"]), stack.bucket, "eval/eval.parquet")
    for s3, said in ((unreachable, "could not be reached"), (denied, "denied")):
        with pytest.raises(TritonshipError, match=said):
            _check(stack, name, v2, f"s3://{stack.bucket}/eval/eval.parquet", s3=s3)
        _assert_stable_serving(stack, name, v1, v2)

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(SPEC.to_json())
    cli = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "quality", "-r", repository(stack), "-m", name, "--version", str(v2),
         "--gate", stack.gate.http_url, "--out", str(tmp_path / "out"), "--eval-data", str(cases["a wrong dtype"][0]),
         "--quality-spec", str(spec_file)],
        capture_output=True, text=True, env={**os.environ, **stack.env()}, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 2 and "holds int32, the signature says int64" in cli.stdout + cli.stderr, cli
    assert "Traceback" not in cli.stdout + cli.stderr
    _assert_stable_serving(stack, name, v1, v2)


def _assert_stable_serving(stack, name: str, stable: int, candidate: int) -> None:
    request = training.eval_set(1, seed=5)
    inputs = {k: request[k] for k in ("item_ids", "mask_pos")}
    assert [TritonAdmin(s.http_url).served_version(name, inputs, ["topk_indices"]) for s in stack.replicas] == [
        stable
    ] * len(stack.replicas)
    gate_server = TritonAdmin(stack.gate.http_url)
    assert gate_server.is_ready(f"{name}__candidate", candidate) and not gate_server.is_ready(name)
