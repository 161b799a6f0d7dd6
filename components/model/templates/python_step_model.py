"""Serves an ensemble's pre- or post-processing step through Triton's Python backend (written by tritonship).

The step's logic is step.py beside this file: `load(directory) -> state` once, then
`process(state, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`. The same step.py computes the
release's reference outputs in plain Python, so what Triton serves is checked against it.

With a batch dimension (max_batch_size > 0), the requests of one `execute` are joined along it and
processed in one call, then split again: a step treats the rows of a batch independently, as every
batched Triton model does. One call per batch instead of one per request is what lets a step keep up
with a GPU model (docs/design.md section 5). If the joined call fails, each request is processed
alone, so one bad request gets its own error and the others their answers.
"""

import importlib.util
import json
import os
import sys

# The backend stub embeds an interpreter that ignores PYTHONPATH; honour it (numpy lives there).
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        directory = os.path.join(args["model_repository"], args["model_version"])
        spec = importlib.util.spec_from_file_location(
            f"tritonship_step_{config['name']}", os.path.join(directory, "step.py")
        )
        self.step = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.step)
        self.state = self.step.load(directory)
        self.batched = config.get("max_batch_size", 0) > 0
        self.input_names = [t["name"] for t in config["input"]]
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["output"]]

    def execute(self, requests):
        inputs = [
            {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.input_names}
            for request in requests
        ]
        if self.batched and len(requests) > 1:
            try:
                return self._joined(inputs)
            except Exception:  # answered request by request below: the error goes to the request that has it
                pass
        return [self._one(i) for i in inputs]

    def _joined(self, inputs):
        sizes = [len(next(iter(i.values()))) for i in inputs]
        joined = {n: np.concatenate([i[n] for i in inputs]) for n in self.input_names}
        outputs = self._cast(self.step.process(self.state, joined))
        if any(len(value) != sum(sizes) for value in outputs.values()):
            raise ValueError("the step's outputs do not have one row per input row")
        bounds = np.cumsum(sizes)[:-1]
        parts = {n: np.split(value, bounds) for n, value in outputs.items()}
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, parts[n][k]) for n, _ in self.outputs])
            for k in range(len(inputs))
        ]

    def _one(self, inputs):
        try:
            outputs = self._cast(self.step.process(self.state, inputs))
            return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, outputs[n]) for n, _ in self.outputs])
        except Exception as exc:  # one bad request must not take the step down
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}"))

    def _cast(self, outputs):
        return {n: np.ascontiguousarray(np.asarray(outputs[n]).astype(dtype, copy=False)) for n, dtype in self.outputs}
