"""The same model served eager (Python backend running the nn.Module) and as compiled TorchScript
(tritonship's python flavour serving model.pt), through the embedded Triton, at two loads.

    .venv/bin/python benchmarks/served_speed.py [--repeats 3]

For each model (the sample model and its wider v3), each serving form and concurrency 1 and 4:
perf_analyzer `repeats` times (1 s windows); medians of throughput and p99. Writes
benchmarks/results/served_speed_cpu.json. (On the GPU machine this needs Triton there, which the
device tool cannot carry: see benchmarks/README.md.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components import perf
from components.compile import compile_model
from components.export import export
from components.model_folder import load_golden
from components.triton_admin import TritonAdmin
from pipelines import sample_models
from pipelines.stack import PRODUCTION_PREFIX, EmbeddedStack
from tests.models import upload_folder

HERE = Path(__file__).parent


def eager_folder(compiled: Path, out: Path, name: str, factory: str) -> Path:
    """The compiled folder, its model.py replaced by one that runs the eager module."""
    shutil.copytree(compiled, out)
    (out / "1" / "model.py").write_text((HERE / "served" / "eager_model.py").read_text())
    torch.save(getattr(sample_models, factory)().state_dict(), out / "1" / "state_dict.pt")
    config = (out / "config.pbtxt").read_text().replace(f'name: "{compiled.name}"', f'name: "{name}"')
    (out / "config.pbtxt").write_text(
        config + f'parameters {{ key: "factory" value {{ string_value: "{factory}" }} }}\n'
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=1) as stack:
        tmp_path = Path(tmp)
        (tmp_path / "sig.yaml").write_text(sample_models.SAMPLE_SIGNATURE)
        server = stack.replicas[0]
        client = stack.s3.client()
        for factory in ("sample_v1", "sample_v3_slow"):
            export(f"pipelines.sample_models:{factory}", tmp_path / "sig.yaml", tmp_path / f"{factory}-export")
            compiled = tmp_path / f"ts_{factory}"
            compile_model(tmp_path / f"{factory}-export", compiled, compiled.name, flavour="python")
            eager = eager_folder(compiled, tmp_path / f"eager_{factory}", f"eager_{factory}", factory)
            golden, _ = load_golden(compiled / "1" / "golden.npz")
            data = perf.write_input_data(golden, tmp_path / "input.json", batched=True)
            for form, folder in (("eager nn.Module", eager), ("compiled TorchScript", compiled)):
                upload_folder(client, stack.bucket, folder, f"{PRODUCTION_PREFIX}/{folder.name}")
                with TritonAdmin(server.http_url) as admin:
                    admin.load(folder.name)
                for concurrency in (1, 4):
                    load = perf.LoadSettings(concurrency=concurrency, window_ms=1000, stability_pct=20)
                    runs = [perf.measure(server.http_url, folder.name, data, load) for _ in range(args.repeats)]
                    ok = [r.points[0] for r in runs if r.ok]
                    rows.append({
                        "model": factory, "served": form, "concurrency": concurrency, "runs_ok": len(ok),
                        "throughput": statistics.median(p.throughput for p in ok) if ok else None,
                        "p99_ms": statistics.median(p.p99_us for p in ok) / 1000 if ok else None,
                    })  # fmt: skip
                    print(rows[-1], flush=True)
                with TritonAdmin(server.http_url) as admin:
                    admin.unload(folder.name)
    print(f"\n{'model':<15} {'served as':<21} {'conc.':>5} {'infer/s':>9} {'p99 ms':>8}")
    for r in rows:
        print(
            f"{r['model']:<15} {r['served']:<21} {r['concurrency']:>5} {r['throughput'] or 0:>9,.0f} {r['p99_ms'] or 0:>8.2f}"
        )
    out = HERE / "results" / "served_speed_cpu.json"
    out.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
