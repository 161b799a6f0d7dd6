"""Python-backend model.py for benchmarks/served_speed.py only: serves the eager nn.Module (the
sample model's factory, its state_dict from state_dict.pt beside this file) without compiling it, on
the GPU of a KIND_GPU instance, in fp16 when the config's `precision` parameter says so (float32 in
and out, as the compiled fp16 model keeps them)."""

import json
import os
import sys

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from pipelines import sample_models  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        factory = config["parameters"]["factory"]["string_value"]
        torch.set_num_threads(1)
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        self.dtype = torch.float16 if config["parameters"]["precision"]["string_value"] == "fp16" else torch.float32
        self.model = getattr(sample_models, factory)()
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.model.load_state_dict(torch.load(os.path.join(folder, "state_dict.pt"), weights_only=True))
        self.model.to(self.device, self.dtype).eval()

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "features").as_numpy() for r in requests]
        sizes = np.cumsum([len(x) for x in inputs])[:-1]
        with torch.inference_mode():
            features = torch.from_numpy(np.concatenate(inputs)).to(self.device, self.dtype)
            scores = self.model(features).float().cpu().numpy()
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("scores", np.ascontiguousarray(part))])
            for part in np.split(scores, sizes)
        ]
