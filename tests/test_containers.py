"""The project's images, built here (bash scripts/setup.sh --containers: images/versions.yaml `local`). The release
pipeline run by KFP's DockerRunner with every task in them is tests/test_user_package.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipelines.container_runner import local_images
from pipelines.image_build import host_pip_mounts
from pipelines.images import matrix

pytestmark = pytest.mark.containers
LOCAL = matrix()["local"]["images"]


def in_image(image: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "run", "--rm", "--network", "none", image, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("kind", ["tools", "gate"])
def test_each_image_runs_tritonship_as_its_own_user_with_the_matrix_torch(kind):
    ran = in_image(
        LOCAL[kind],
        'id -u; tritonship --help >/dev/null && echo tritonship-ok; python -c "import torch; print(torch.__version__)"'
        '; echo "$TRITONSHIP_IMAGE"',
    )
    assert ran.returncode == 0, ran.stderr
    uid, ok, torch_version, image = ran.stdout.split()
    assert uid == "10001" and ok == "tritonship-ok" and image == LOCAL[kind]
    # the compile tasks (CPU targets) run in the tools image: its torch is the one the matrix pins
    assert torch_version.split("+")[0] == matrix()["tools_torch"]


def test_the_compile_tasks_run_in_the_tools_image():
    images = local_images()
    assert images[matrix()["images"]["compile"]] == LOCAL["tools"] == images[matrix()["images"]["tools"]]
    assert images[matrix()["images"]["gate"]] == LOCAL["gate"]


def test_the_gate_image_finds_a_working_perf_analyzer():
    ran = in_image(
        LOCAL["gate"],
        'python -c "from components.serving.tools import find_perf_analyzer; print(find_perf_analyzer().path)"'
        "; perf_analyzer --help 2>&1 | head -3",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0] == "/usr/local/bin/perf_analyzer"
    assert "error while loading shared libraries" not in ran.stdout and "perf_analyzer" in ran.stdout


@pytest.mark.parametrize("kind", ["tools", "gate"])
def test_no_host_pip_configuration_or_certificate_stays_in_an_image(kind, tmp_path):
    # what the build mounted (podman leaves each mount point behind, empty) must hold nothing in the image
    mounted = host_pip_mounts(tmp_path)[1::2]
    assert mounted, "this machine's pip has no configuration to give a build"
    bundle = "/etc/ssl/certs/ca-certificates.crt"  # the image's own bundle: its content is compared below
    targets = [m.split(":")[1] for m in mounted if m.split(":")[1] != bundle]
    ran = in_image(
        LOCAL[kind],
        f"find {' '.join(targets)} -type f -size +0 2>/dev/null; python -m pip config list | grep -v '^:env:'; "
        f"cat {bundle}",
    )
    assert ran.stdout.startswith("-----BEGIN CERTIFICATE-----"), ran.stdout[:300]  # the image's own bundle only
    assert ran.stdout != Path(bundle).read_text()
    for host_certificate in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        assert host_certificate.read_text().strip() not in ran.stdout, host_certificate
