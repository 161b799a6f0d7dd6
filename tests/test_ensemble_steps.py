"""An ensemble's steps on their own: the Python step wrapper's batching and its failure per request, and the
BERT4Rec with its steps folded in, against pre, model and post run apart."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from components.model import model_config
from components.model.model_config import ServingSettings
from components.serving.triton_admin import TritonAdmin, TritonError
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build
from tests.release_helpers import unique

JOINED_STEP = """
import numpy as np

def load(directory):
    return None

def process(state, inputs):
    x = inputs["x"]
    if (x < 0).any():
        raise ValueError("negative input")
    return {"y": x * 2, "rows": np.full((len(x), 1), len(x), dtype=np.int64)}
"""


def test_a_step_serves_a_batch_of_requests_in_one_call_and_fails_only_the_bad_request(tmp_path, stack):
    """The Python step wrapper joins the requests of one batch into one `process` call (what lets the steps
    keep up with a GPU model), and a request that makes the joined call fail gets its own error while the
    others of its batch get their answers."""
    from components.model.ensemble import Step, write_step
    from components.model.signature import Signature

    (tmp_path / "step").mkdir()
    (tmp_path / "step" / "step.py").write_text(JOINED_STEP)
    tensor = {"dtype": "int64", "shape": [-1, 1]}
    signature = Signature.from_dict(
        {
            "batch": True,
            "max_batch_size": 8,
            "inputs": [{"name": "x", **tensor}],
            "outputs": [{"name": "y", **tensor}, {"name": "rows", **tensor}],
        }
    )
    name = unique("joined_step")
    folder = write_step(Step(name, tmp_path / "step", signature), tmp_path / name)
    config = model_config.with_settings(
        model_config.parse_pbtxt((folder / "config.pbtxt").read_text()),
        ServingSettings(max_batch_size=8, max_queue_delay_us=2_000_000, preferred_batch_sizes=(8,)),
    )
    files = {f"file:1/{p.name}": p.read_bytes() for p in (folder / "1").iterdir() if p.is_file()}
    admin = TritonAdmin(stack.gate.http_url)
    admin.load(name, config, files)
    try:
        admin.wait_ready(name)

        def send(value: int):
            with TritonAdmin(stack.gate.http_url) as client:
                try:
                    return client.infer(name, {"x": np.array([[value]], dtype=np.int64)}, ["y", "rows"])
                except TritonError as exc:
                    return exc

        with ThreadPoolExecutor(8) as pool:
            good = list(pool.map(send, range(1, 9)))
        assert [int(a["y"][0, 0]) for a in good] == [2 * v for v in range(1, 9)]
        assert max(int(a["rows"][0, 0]) for a in good) > 1  # requests of one batch were processed in one call

        with ThreadPoolExecutor(8) as pool:
            mixed = list(pool.map(send, [1, 2, 3, -1, 5, 6, 7, 8]))
        failed = [a for a in mixed if isinstance(a, TritonError)]
        assert len(failed) == 1 and "negative input" in str(failed[0])
        assert [int(a["y"][0, 0]) for a in mixed if not isinstance(a, TritonError)] == [2, 4, 6, 10, 12, 14, 16]
    finally:
        admin.unload(name)


def test_the_bert4rec_with_its_steps_folded_in_answers_as_pre_model_post(tmp_path):
    """benchmarks/ensemble_hops.py times the two forms side by side; they must be the same recommender,
    unknown catalogue ids included, traced at one batch size and run at another."""
    import torch

    from components.model.ensemble import reference_outputs
    from components.model.signature import Signature

    pre, post = bert4rec_build.ensemble_steps(tmp_path, "b4r")
    history = bert4rec.histories(8, seed=3)
    history[0, :5] = 12_345  # no catalogue id
    model = Signature.from_dict(bert4rec.MODEL_SIGNATURE)
    expected = reference_outputs(pre, bert4rec.bert4rec_v1(), model, post, {"history": history})
    with torch.no_grad():
        folded = torch.jit.trace(bert4rec.folded_v1(), (torch.from_numpy(history[:2]),), check_trace=False)
        recommended, scores = (t.numpy() for t in folded(torch.from_numpy(history)))
    np.testing.assert_array_equal(recommended, expected["recommended"])
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-5, atol=1e-7)
