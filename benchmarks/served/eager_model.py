"""Python-backend model.py for benchmarks/served_speed.py only: serves the eager nn.Module (the config's
`factory`, `package.module:function`, its state_dict from state_dict.pt beside this file) without compiling
it, on the GPU of a KIND_GPU instance, in fp16 when the config's `precision` parameter says so (float
inputs and outputs stay float32, as the compiled fp16 model keeps them; integer tensors pass as they are)."""

import importlib
import json
import os
import sys

sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
# transformers imports scikit-learn when it is installed; on the GPU machine that pulls in a SciPy built for
# numpy 2, which fails under the stub's numpy 1.x ("module 'numpy' has no attribute 'long'"). Running a model
# needs neither: hidden, transformers finds it not installed.
for _hidden in ("sklearn", "scipy"):
    sys.modules.setdefault(_hidden, None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        module, _, function = config["parameters"]["factory"]["string_value"].partition(":")
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        torch.set_num_threads(1)
        gpu = args["model_instance_kind"] == "GPU"
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}" if gpu else "cpu")
        self.dtype = torch.float16 if config["parameters"]["precision"]["string_value"] == "fp16" else torch.float32
        try:
            self.model = getattr(importlib.import_module(module), function)()
        except Exception as exc:  # the stub passes on the message alone: keep its causes in it
            causes, cause = [], exc
            while cause is not None:
                causes.append(f"{type(cause).__name__}: {cause}")
                cause = cause.__cause__ or cause.__context__
            raise RuntimeError(" <- ".join(causes)) from exc
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.model.load_state_dict(torch.load(os.path.join(folder, "state_dict.pt"), weights_only=True))
        self.model.to(self.device, self.dtype).eval()

    def _tensor(self, array):
        tensor = torch.from_numpy(array).to(self.device)
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor

    def execute(self, requests):
        batches = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs] for r in requests]
        sizes = np.cumsum([len(b[0]) for b in batches])[:-1]
        with torch.inference_mode():
            args = [self._tensor(np.concatenate([b[i] for b in batches])) for i in range(len(self.inputs))]
            result = self.model(*args)
        result = (result,) if isinstance(result, torch.Tensor) else result
        outputs = [(t.float() if t.is_floating_point() else t).cpu().numpy() for t in result]
        split = [np.split(o, sizes) for o in outputs]  # per output, one part per request
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(n, np.ascontiguousarray(split[k][i])) for k, n in enumerate(self.outputs)
                ]
            )
            for i in range(len(requests))
        ]
