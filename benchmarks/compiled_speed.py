"""Compile each test model with the torchscript target and time it against eager, with parity.

    python benchmarks/compiled_speed.py [--out benchmarks/compiled_speed_<device>.json]

On a CUDA machine: fp32 and fp16 TorchScript on the GPU (the CUDA path of the compile step, parity
included) against eager fp32 on the GPU. Elsewhere: fp32 TorchScript on the CPU against eager.
Latency is the median of 200 timed calls after 20 warm-ups, synchronised, at batch 1 and at the
model's max_batch_size; one invocation, one machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.model.compile import compile_model
from components.model.export import export
from components.model.settings import CompileSettings
from components.model.signature import Signature
from tests.models import MODELS, write_signature


def median_ms(fn, args, device: str, repeats: int = 200, warmup: int = 20) -> float:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.inference_mode():
        for _ in range(warmup):
            fn(*args)
        sync()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn(*args)
            sync()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precisions = ["fp32", "fp16"] if device == "cuda" else ["fp32"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        for key, (factory, signature_dict) in MODELS.items():
            signature = Signature.from_dict(signature_dict)
            export_dir = tmp_path / f"{key}-export"
            export(factory, write_signature(tmp_path / f"{key}.yaml", signature_dict), export_dir)
            module, attr = factory.split(":")
            eager = getattr(importlib.import_module(module), attr)().eval().to(device)
            for precision in precisions:
                out = tmp_path / f"{key}-{precision}"
                result = compile_model(export_dir, out, key, CompileSettings(precision=precision, device=device))
                compiled = torch.jit.load(str(out / "1" / "model.pt"), map_location=device)
                for batch in (1, signature.max_batch_size):
                    inputs = [torch.from_numpy(a).to(device) for a in signature.example_inputs(batch).values()]
                    rows.append(
                        {
                            "model": key,
                            "precision": precision,
                            "batch": batch,
                            "eager_ms": round(median_ms(eager, inputs, device), 4),
                            "compiled_ms": round(median_ms(compiled, inputs, device), 4),
                            "parity": [
                                {"output": p.name, "check": p.check, "max_abs_err": p.max_abs_err, "passed": p.passed}
                                for p in result.parity
                            ],
                            "compile_seconds": round(result.seconds, 2),
                        }
                    )
    info = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rows": rows,
    }
    print(f"device: {info['device']}  torch {info['torch']}  cuda {info['cuda']}")
    print(
        f"{'model':<12} {'prec':<5} {'batch':>5} {'eager ms':>9} {'compiled ms':>12} {'speed-up':>9}  parity (max abs err)"
    )
    for r in rows:
        parity = ", ".join(
            f"{p['output']}:{p['max_abs_err']:.1e}{'' if p['passed'] else ' FAIL'}"
            for p in r["parity"]
            if p["check"] == "golden"
        )
        print(
            f"{r['model']:<12} {r['precision']:<5} {r['batch']:>5} {r['eager_ms']:>9.3f} {r['compiled_ms']:>12.3f} "
            f"{r['eager_ms'] / r['compiled_ms']:>8.2f}x  {parity}"
        )
    out = args.out or Path(__file__).with_name(f"compiled_speed_{device}.json")
    out.write_text(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
