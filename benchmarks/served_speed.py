"""One compiled model.pt served side by side, through the embedded Triton, in up to three forms:
`pytorch` (the compile step's folder as production serves it: Triton's PyTorch backend), `python` (the
same model.pt run by a Python-backend model.py, benchmarks/served/torchscript_model.py) and `eager` (the
nn.Module, uncompiled, in the Python backend, benchmarks/served/eager_model.py).

    .venv/bin/python benchmarks/served_speed.py --models bert4rec --forms pytorch,python --concurrency 1 8
    .venv/bin/python benchmarks/served_speed.py --models users --forms pytorch --concurrency 1
    python3 benchmarks/served_speed.py --device cuda --forms pytorch,eager --concurrency 1 16   # GPU, fp16 too

For each model (the sample model and its wider v3, the BERT4Rec v1 and its slower v3, or the users'-size
BERT4Rec), each precision, and each concurrency, the forms take turns, `repeats` rounds of one
perf_analyzer run each (1 s windows); medians of throughput and p99. Every form serves with one torch
thread per instance. Every form must answer like the eager model before it is timed. On CUDA the model
is compiled on the GPU and every form runs on a KIND_GPU instance. Writes
benchmarks/results/served_speed_<cpu|cuda_gpu-name>[_<models>].json.
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

from components.model import model_config
from components.model.compile import compile_model
from components.model.export import export
from components.model.model_folder import load_golden
from components.model.parity import Tolerance
from components.model.settings import CompileSettings
from components.serving import perf
from components.serving.triton_admin import TritonAdmin
from pipelines import sample_models
from pipelines.samples import bert4rec
from pipelines.stack import PRODUCTION_PREFIX, EmbeddedStack
from tests.models import upload_folder

HERE = Path(__file__).parent
# model family -> (module of the factories, the two factories, signature text)
MODELS = {
    "sample": ("pipelines.sample_models", ("sample_v1", "sample_v3_slow"), sample_models.SAMPLE_SIGNATURE),
    "bert4rec": ("pipelines.samples.bert4rec", ("bert4rec_v1", "bert4rec_v3_slow"), bert4rec.MODEL_SIGNATURE_YAML),
    "users": ("pipelines.samples.bert4rec", ("users_v1",), json.dumps(bert4rec.USERS.signatures()["model"])),
}
FORMS = {"pytorch": "PyTorch backend", "python": "Python backend, model.pt", "eager": "eager nn.Module"}


def python_backend_folder(compiled: Path, out: Path, model_py: str, parameters: dict[str, str]) -> Path:
    """The compiled folder (same tensors, batching and instance kind) served by `model_py` in the Python
    backend, with `parameters` added to its config."""
    shutil.copytree(compiled, out)
    (out / "1" / "model.py").write_text((HERE / "served" / model_py).read_text())
    config = model_config.parse_pbtxt((out / "config.pbtxt").read_text())
    config.name, config.platform, config.backend = out.name, "", "python"
    config.parameters.clear()
    for key, value in {"torch_threads": "1", **parameters}.items():
        config.parameters[key].string_value = value
    (out / "config.pbtxt").write_text(model_config.to_pbtxt(config))
    return out


def form_folder(form: str, compiled: Path, tmp_path: Path, factory: str, precision: str) -> Path:
    if form == "pytorch":
        return compiled
    out = tmp_path / f"{form}_{compiled.name}"
    if form == "python":
        return python_backend_folder(compiled, out, "torchscript_model.py", {})
    module, _, function = factory.partition(":")
    folder = python_backend_folder(compiled, out, "eager_model.py", {"factory": factory, "precision": precision})
    torch.save(getattr(importlib.import_module(module), function)().state_dict(), folder / "1" / "state_dict.pt")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to compile and serve on the GPU")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--models", choices=sorted(MODELS), default="sample")
    parser.add_argument("--forms", default="pytorch,python", help=f"comma-separated, of {', '.join(FORMS)}")
    args = parser.parse_args()
    module, factories, signature = MODELS[args.models]
    forms = args.forms.split(",")
    if not forms or set(forms) - set(FORMS):
        parser.error(f"--forms takes some of {', '.join(FORMS)}, comma-separated")
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
            chosen = CompileSettings(precision=precision, device=args.device)
            compile_model(tmp_path / f"{factory}-export", compiled, compiled.name, chosen)
            golden, expected = load_golden(compiled / "1" / "golden.npz")
            data = perf.write_input_data(golden, tmp_path / "input.json", batched=True)
            folders = {form: form_folder(form, compiled, tmp_path, f"{module}:{factory}", precision) for form in forms}
            with TritonAdmin(server.http_url) as admin:
                for folder in folders.values():
                    upload_folder(client, stack.bucket, folder, f"{PRODUCTION_PREFIX}/{folder.name}")
                    admin.load(folder.name)
                    _check_answers(admin, folder.name, golden, expected, precision)
            for concurrency in args.concurrency:
                load = perf.LoadSettings(concurrency=concurrency, window_ms=1000, stability_pct=20)
                runs: dict[str, list] = {form: [] for form in forms}
                for _round in range(args.repeats):  # the forms take turns: each sees the same machine
                    for form, folder in folders.items():
                        runs[form].append(perf.measure(server.http_url, folder.name, data, load))
                for form in forms:
                    ok = [r.points[0] for r in runs[form] if r.ok]
                    rows.append(
                        {
                            "model": factory,
                            "precision": precision,
                            "served": FORMS[form],
                            "concurrency": concurrency,
                            "runs_ok": len(ok),
                            "failures": [r.reason for r in runs[form] if not r.ok],
                            "throughput": statistics.median(p.throughput for p in ok) if ok else None,
                            "p99_ms": statistics.median(p.p99_us for p in ok) / 1000 if ok else None,
                        }
                    )
                    print(rows[-1], flush=True)
            with TritonAdmin(server.http_url) as admin:
                for folder in folders.values():
                    admin.unload(folder.name)
    print(f"\n{'model':<17} {'prec.':<5} {'served as':<25} {'conc.':>5} {'infer/s':>9} {'p99 ms':>8}")
    for r in rows:
        print(
            f"{r['model']:<17} {r['precision']:<5} {r['served']:<25} {r['concurrency']:>5} "
            f"{r['throughput'] or 0:>9,.0f} {r['p99_ms'] or 0:>8.2f}"
        )
    machine = torch.cuda.get_device_name() if gpu else "cpu"
    suffix = "" if args.models == "sample" else f"_{args.models}"
    out = HERE / "results" / f"served_speed_{'cuda_' + machine.split()[-1].lower() if gpu else 'cpu'}{suffix}.json"
    out.write_text(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "repeats": args.repeats,
                "device": args.device,
                "machine": machine,
                "torch": torch.__version__,
                "cpus": os.cpu_count(),
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


def _check_answers(admin: TritonAdmin, name: str, golden: dict, expected: dict, precision: str) -> None:
    """Only a server that answers like the eager model is worth timing."""
    answer = admin.infer_in_batches(name, golden, list(expected), 8)
    tol = Tolerance.for_precision(precision)
    for output, want in expected.items():
        if want.dtype.kind == "f":
            np.testing.assert_allclose(answer[output], want, rtol=tol.rtol, atol=tol.atol)
        else:
            assert np.mean(answer[output] != want) <= tol.int_mismatch, output


if __name__ == "__main__":
    main()
