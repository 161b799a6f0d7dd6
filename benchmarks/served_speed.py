"""The same model served eager (Python backend running the nn.Module) and as compiled TorchScript
(tritonship's python flavour serving model.pt), through the embedded Triton, at two loads.

    .venv/bin/python benchmarks/served_speed.py [--repeats 3] [--models sample|bert4rec]   # CPU, fp32
    python3 benchmarks/served_speed.py --device cuda --concurrency 1 16                   # GPU, fp32 and fp16

For each model (the sample model and its wider v3, or the BERT4Rec v1 and its slower v3), each
precision, each serving form and each
concurrency: perf_analyzer `repeats` times (1 s windows); medians of throughput and p99. On CUDA the
model is compiled on the GPU and both forms run on a KIND_GPU instance; fp16 is the compile step's
fp16 TorchScript against the eager module in half precision, float32 in and out for both. Writes
benchmarks/results/served_speed_<cpu|cuda_gpu-name>[_bert4rec].json. benchmarks/gpu_served_speed.sh runs
it on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components import perf
from components.compile import compile_model
from components.export import export
from components.model_folder import load_golden
from components.parity import Tolerance
from components.triton_admin import TritonAdmin
from pipelines import sample_models
from pipelines.samples import bert4rec
from pipelines.stack import PRODUCTION_PREFIX, EmbeddedStack
from tests.models import upload_folder

HERE = Path(__file__).parent
# model family -> (module of the factories, the two factories, signature text)
MODELS = {
    "sample": ("pipelines.sample_models", ("sample_v1", "sample_v3_slow"), sample_models.SAMPLE_SIGNATURE),
    "bert4rec": ("pipelines.samples.bert4rec", ("bert4rec_v1", "bert4rec_v3_slow"), bert4rec.MODEL_SIGNATURE_YAML),
}


def eager_folder(compiled: Path, out: Path, name: str, factory: str, precision: str) -> Path:
    """The compiled folder (same config, instance kind included), its model.py replaced by one that
    runs the eager module (`factory` is package.module:function)."""
    shutil.copytree(compiled, out)
    (out / "1" / "model.py").write_text((HERE / "served" / "eager_model.py").read_text())
    module, _, function = factory.partition(":")
    torch.save(getattr(importlib.import_module(module), function)().state_dict(), out / "1" / "state_dict.pt")
    config = (out / "config.pbtxt").read_text().replace(f'name: "{compiled.name}"', f'name: "{name}"')
    (out / "config.pbtxt").write_text(
        config
        + f'parameters {{ key: "factory" value {{ string_value: "{factory}" }} }}\n'
        + f'parameters {{ key: "precision" value {{ string_value: "{precision}" }} }}\n'
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to compile and serve on the GPU")
    parser.add_argument("--concurrency", type=int, nargs=2, default=[1, 4])
    parser.add_argument("--models", choices=sorted(MODELS), default="sample")
    args = parser.parse_args()
    module, factories, signature = MODELS[args.models]
    gpu = args.device.startswith("cuda")
    precisions = ("fp32", "fp16") if gpu else ("fp32",)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=1) as stack:
        tmp_path = Path(tmp)
        (tmp_path / "sig.yaml").write_text(signature)
        server = stack.replicas[0]
        client = stack.s3.client()
        for factory, precision in itertools.product(factories, precisions):
            if not (tmp_path / f"{factory}-export").exists():
                export(f"{module}:{factory}", tmp_path / "sig.yaml", tmp_path / f"{factory}-export")
            compiled = tmp_path / f"ts_{factory}_{precision}"
            compile_model(
                tmp_path / f"{factory}-export", compiled, compiled.name, precision=precision, device=args.device,
                flavour="python",
            )  # fmt: skip
            eager = eager_folder(compiled, tmp_path / f"eager_{factory}_{precision}", f"eager_{factory}_{precision}",
                                 f"{module}:{factory}", precision)  # fmt: skip
            golden, expected = load_golden(compiled / "1" / "golden.npz")
            data = perf.write_input_data(golden, tmp_path / "input.json", batched=True)
            for form, folder in (("eager nn.Module", eager), ("compiled TorchScript", compiled)):
                upload_folder(client, stack.bucket, folder, f"{PRODUCTION_PREFIX}/{folder.name}")
                with TritonAdmin(server.http_url) as admin:
                    admin.load(folder.name)
                    # Only a server that answers like the eager model is worth timing.
                    answer = admin.infer_in_batches(folder.name, golden, list(expected), 8)
                    tol = Tolerance.for_precision(precision)
                    for name, want in expected.items():
                        if want.dtype.kind == "f":
                            np.testing.assert_allclose(answer[name], want, rtol=tol.rtol, atol=tol.atol)
                        else:
                            assert np.mean(answer[name] != want) <= tol.int_mismatch, name
                for concurrency in args.concurrency:
                    load = perf.LoadSettings(concurrency=concurrency, window_ms=1000, stability_pct=20)
                    runs = [perf.measure(server.http_url, folder.name, data, load) for _ in range(args.repeats)]
                    ok = [r.points[0] for r in runs if r.ok]
                    failures = [r.reason for r in runs if not r.ok]
                    rows.append({
                        "model": factory, "precision": precision, "served": form, "concurrency": concurrency,
                        "runs_ok": len(ok), "failures": failures,
                        "throughput": statistics.median(p.throughput for p in ok) if ok else None,
                        "p99_ms": statistics.median(p.p99_us for p in ok) / 1000 if ok else None,
                    })  # fmt: skip
                    print(rows[-1], flush=True)
                with TritonAdmin(server.http_url) as admin:
                    admin.unload(folder.name)
    print(f"\n{'model':<17} {'prec.':<5} {'served as':<21} {'conc.':>5} {'infer/s':>9} {'p99 ms':>8}")
    for r in rows:
        print(
            f"{r['model']:<17} {r['precision']:<5} {r['served']:<21} {r['concurrency']:>5} "
            f"{r['throughput'] or 0:>9,.0f} {r['p99_ms'] or 0:>8.2f}"
        )
    machine = torch.cuda.get_device_name() if gpu else "cpu"
    suffix = "" if args.models == "sample" else f"_{args.models}"
    out = HERE / "results" / f"served_speed_{'cuda_' + machine.split()[-1].lower() if gpu else 'cpu'}{suffix}.json"
    out.write_text(json.dumps({
        "repeats": args.repeats, "device": args.device, "machine": machine, "torch": torch.__version__,
        "cpus": os.cpu_count(), "rows": rows,
    }, indent=2))  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
