"""The demo: a small TorchScript model through the embedded stack (S3 -> Triton -> perf_analyzer)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from components import model_folder, perf
from components.signature import Signature
from components.triton_admin import TritonAdmin
from pipelines.stack import PRODUCTION_PREFIX, EmbeddedStack

DEMO_SIGNATURE = {
    "batch": True,
    "max_batch_size": 16,
    "inputs": [{"name": "features", "dtype": "fp32", "shape": [-1, 32]}],
    "outputs": [{"name": "scores", "dtype": "fp32", "shape": [-1, 8]}],
}


def demo_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()


def run_demo(console: Console) -> int:
    signature = Signature.from_dict(DEMO_SIGNATURE)
    model = demo_model()
    with tempfile.TemporaryDirectory(prefix="tritonship-demo-") as tmp:
        tmp_path = Path(tmp)
        golden_in = signature.example_inputs(16)
        with torch.inference_mode():
            golden_out = {"scores": model(torch.from_numpy(golden_in["features"])).numpy()}
        torch.jit.trace(model, torch.from_numpy(golden_in["features"])).save(tmp_path / "model.pt")
        folder = model_folder.write(
            tmp_path / "mlp", "mlp", signature, tmp_path / "model.pt", "python", golden_in, golden_out, {}
        )
        with console.status("starting S3 and Triton"), EmbeddedStack(replicas=1) as stack:
            server = stack.replicas[0]
            console.print(f"S3 {stack.s3.endpoint_url}, Triton http://{server.http_url} (explicit model control)")
            client = stack.s3.client()
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                key = f"{PRODUCTION_PREFIX}/mlp/{path.relative_to(folder)}"
                client.upload_file(str(path), stack.bucket, key)
                console.print(f"  put s3://{stack.bucket}/{key}")
            with TritonAdmin(server.http_url) as admin:
                started = time.monotonic()
                admin.load("mlp")
                console.print(f"loaded 'mlp' from S3 in {time.monotonic() - started:.1f} s")
                answer = admin.infer("mlp", golden_in, ["scores"])["scores"]
            error = float(np.abs(answer - golden_out["scores"]).max())
            console.print(f"inference on 16 golden samples: max |triton - eager| = {error:.2e}")
            data = perf.write_input_data(golden_in, tmp_path / "input.json", batched=True)
            table = Table(title="perf_analyzer on the embedded Triton (latencies in ms)")
            for column in ("concurrency", "infer/s", "p50", "p90", "p99", "exit"):
                table.add_column(column, justify="right")
            for concurrency in (1, 2):
                run = perf.measure(server.http_url, "mlp", data, perf.LoadSettings(concurrency=concurrency))
                for p in run.points:
                    table.add_row(
                        str(int(p.concurrency)), f"{p.throughput:,.0f}", f"{p.p50_us / 1000:.2f}",
                        f"{p.p90_us / 1000:.2f}", f"{p.p99_us / 1000:.2f}", str(run.exit_code),
                    )  # fmt: skip
                if not run.ok:
                    table.add_row(str(concurrency), "-", "-", "-", "-", f"{run.exit_code}: {run.reason}")
            console.print(table)
    return 0 if error < 1e-4 else 1
