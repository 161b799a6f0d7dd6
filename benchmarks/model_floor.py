"""Where one call of the model step goes: the users' BERT4Rec as the compile step makes it for the PyTorch
backend, against the same weights eager, eager with PyTorch's fused attention (SDPA), and that form
through the compile step too; for each, the time the GPU spends running the call's kernels. That busy time
is what a call could come down to if the host did not launch its kernels one by one (CUDA graphs or
TensorRT: the PyTorch backend offers neither). A CUDA graph of this forward cannot be captured as it is:
transformers' mask building copies a host scalar to the GPU, and capture refuses pageable copies.

    .venv/bin/python benchmarks/model_floor.py --size demo --precision fp32      # CPU smoke
    python3 benchmarks/model_floor.py --device cuda --precision fp16             # the GPU machine (gpu_served_speed.sh floor)

Each form at each batch: the median of 100 calls after 20, inputs on the device, outputs back on the host
as the served model hands them over; and how many operations one call puts on the device, from
torch.profiler: GPU kernels and copies on CUDA, with their durations summed, aten operators (nested ones
included) on the CPU. Writes benchmarks/results/model_floor_<device>_<size>_<precision>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compiled_speed import median_ms
from components.model import model_folder
from components.model.settings import CompileSettings
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build

HERE = Path(__file__).parent
SIZES = {"users": bert4rec.USERS, "demo": bert4rec.DEMO}


def compiled(factory: str, size: bert4rec.Size, device: str, precision: str, work: Path) -> torch.nn.Module:
    """The sample's `factory` through the export and compile steps: the model.pt the PyTorch backend loads."""
    users_fp16 = size == bert4rec.USERS and precision == "fp16"
    int_mismatch = bert4rec.USERS_FP16_TOLERANCE.int_mismatch if users_fp16 else None
    chosen = CompileSettings(precision=precision, device=device, int_mismatch=int_mismatch)
    folder = bert4rec_build.compiled_folder(factory, size.signatures()["model"], work / "model", chosen)
    return torch.jit.load(str(model_folder.read(folder).version_dir / model_folder.MODEL_FILE), device)


def eager(model: Callable[..., Sequence[torch.Tensor]]) -> Callable:
    def call(*args: torch.Tensor) -> list[torch.Tensor]:
        return [out.cpu() for out in model(*args)]

    return call


def operations(fn: Callable, args: list[torch.Tensor], device: str) -> tuple[int, float | None]:
    """What one call puts on the device: on CUDA, its kernels and copies and the milliseconds the GPU spent
    running them (their durations summed, gaps left out); on the CPU, the aten operators it runs."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.inference_mode(), torch.profiler.profile(activities=activities) as prof:
        fn(*args)
    if device.startswith("cuda"):
        on_gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return len(on_gpu), sum(e.time_range.elapsed_us() for e in on_gpu) / 1000
    return sum(1 for e in prof.events() if e.name.startswith("aten::")), None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    parser.add_argument("--size", default="users", choices=tuple(SIZES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    size = SIZES[args.size]
    base, sdpa = ("users_v1", "users_sdpa_v1") if args.size == "users" else ("bert4rec_v1", "bert4rec_sdpa_v1")
    report: dict = {"command": " ".join(sys.argv), "torch": torch.__version__, "rows": []}
    report["device"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    dtype = torch.float16 if args.precision == "fp16" else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        compiled_modules: dict[str, torch.nn.Module] = {}
        for label, factory in {"compiled": base, "compiled, sdpa": sdpa}.items():
            (Path(tmp) / label).mkdir()
            compiled_modules[label] = compiled(factory, size, args.device, args.precision, Path(tmp) / label)
        forms: dict[str, Callable] = {label: eager(module) for label, module in compiled_modules.items()}
        plain = getattr(bert4rec, base)().to(args.device, dtype)
        forms["eager"] = eager(plain)
        forms["eager, sdpa"] = eager(getattr(bert4rec, sdpa)().to(args.device, dtype))
        rng = np.random.default_rng(5)
        for batch in args.batches:
            # what the pre step hands the model: item indices, the mask token last, and its position
            items = rng.integers(1, size.items + 1, size=(batch, size.length - 1))
            ids = np.concatenate([items, np.full((batch, 1), size.items + 1)], axis=1)
            inputs = [torch.from_numpy(a).to(args.device) for a in (ids, np.full((batch, 1), size.length - 1))]
            for form, fn in forms.items():
                ms = median_ms(fn, inputs, args.device, repeats=100, warmup=20)
                count, gpu_ms = operations(fn, inputs, args.device)
                row = {"form": form, "batch": batch, "ms": round(ms, 3), "operations": count}
                busy = ""
                if gpu_ms is not None:
                    row["gpu_busy_ms"] = round(gpu_ms, 3)
                    busy = f", the GPU busy {gpu_ms:.3f} ms ({gpu_ms / ms:.0%})"
                report["rows"].append(row)
                print(f"  {form:<15} batch {batch:>3}: {ms:7.3f} ms  {count:>4} operations{busy}", flush=True)
    out = HERE / "results" / f"model_floor_{args.device.split(':')[0]}_{args.size}_{args.precision}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
