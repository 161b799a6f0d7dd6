"""Python-backend model.py for benchmarks/served_speed.py only: serves a compiled model.pt through Triton's
Python backend, the way tritonship's embedded stack did before it built Triton's PyTorch backend, so that
the two can be measured side by side. Requests of one batch are concatenated along dimension 0 and run in
one forward(); the config's `torch_threads` parameter sets torch's threads (default 1).
"""

import json
import os
import sys

# The backend stub embeds an interpreter that ignores PYTHONPATH; honour it, ahead of the interpreter's
# own paths as PYTHONPATH would be, so that the stub's numpy 1.x and torch are the ones imported.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.batched = config.get("max_batch_size", 0) > 0
        self.input_names = [t["name"] for t in config["input"]]
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["output"]]
        threads = int(config.get("parameters", {}).get("torch_threads", {}).get("string_value", "1"))
        torch.set_num_threads(threads)
        # KIND_GPU instances run on the GPU Triton assigns them (model.pt compiled for CUDA).
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        path = os.path.join(args["model_repository"], args["model_version"], "model.pt")
        self.model = torch.jit.load(path, map_location=self.device).eval()

    def execute(self, requests):
        batches = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.input_names] for r in requests]
        if self.batched and len(batches) > 1:
            sizes = [b[0].shape[0] for b in batches]
            inputs = [np.concatenate(column) for column in zip(*batches, strict=True)]
            outputs = self._run(inputs)
            bounds = np.cumsum(sizes)[:-1]
            per_request = [list(parts) for parts in zip(*(np.split(o, bounds) for o in outputs), strict=True)]
        else:
            per_request = [self._run(b) for b in batches]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(name, np.ascontiguousarray(value.astype(dtype, copy=False)))
                    for (name, dtype), value in zip(self.outputs, values, strict=True)
                ]
            )
            for values in per_request
        ]

    def _run(self, arrays):
        with torch.inference_mode():
            result = self.model(*[torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays])
        if isinstance(result, torch.Tensor):
            result = (result,)
        return [t.detach().cpu().numpy() for t in result]
