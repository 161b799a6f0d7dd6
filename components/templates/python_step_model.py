"""Serves an ensemble's pre- or post-processing step through Triton's Python backend (written by tritonship).

The step's logic is step.py beside this file: `load(directory) -> state` once, then
`process(state, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]` per request. The same step.py
computes the release's reference outputs in plain Python, so what Triton serves is checked against it.
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
        self.input_names = [t["name"] for t in config["input"]]
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.input_names}
            try:
                outputs = self.step.process(self.state, inputs)
                tensors = [
                    pb_utils.Tensor(n, np.ascontiguousarray(outputs[n].astype(dtype))) for n, dtype in self.outputs
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:  # one bad request must not take the step down
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}")))
        return responses
