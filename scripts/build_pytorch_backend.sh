#!/usr/bin/env bash
# Builds Triton's PyTorch backend from Triton's sources against the libtorch inside a Python environment's torch
# wheel. A second run with the same torch and sources does nothing.
#   --release r24.10 (default): the embedded tritonserver 2.51's own backend, TorchScript (`pytorch_libtorch`),
#     installed as <tools>/backends/pytorch/libtriton_pytorch.so.
#   --release r26.05: the backend that also serves AOTInductor PT2 archives (`torch_aoti`), built against
#     backend/core/common r24.10 so that 2.51 loads it, with the patches in scripts/patches/r26.05/ (docs/design.md
#     section 5 says what each fixes), installed as <tools>/backends/torchaoti/libtriton_torchaoti.so: 2.51
#     takes `platform: "torch_aoti"` only with a backend name of its own.
#
#   bash scripts/build_pytorch_backend.sh [--release r24.10|r26.05] [--python .venv/bin/python] [--tools .tools] [--gpu]
#
# Sources, checked against the pins below either way:
#   - `git archive` tarballs: $TRITONSHIP_TRITON_SOURCES (a folder holding r24.10's four and, for r26.05,
#     pytorch_backend-r26.05.tar.gz), else ../shared/third_party/triton-r24.10 and triton-r26.05 beside the
#     checkout (SHA-256 of each archive);
#   - else GitHub at the release's tag (the commit of each clone).
# --gpu builds with TRITON_ENABLE_GPU=ON (the lent GPU machine: torch +cu13, nvcc 13): nvcc 13 refuses the
# backend repository's oldest CUDA architectures and newer compilers trip its -Werror, so both are edited out.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
TOOLS=.tools
GPU=OFF
RELEASE=r24.10
while (($#)); do
  case $1 in
    --release) RELEASE=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --tools) TOOLS=$2; shift 2 ;;
    --gpu) GPU=ON; shift ;;
    *) echo "build_pytorch_backend: unknown option $1" >&2; exit 2 ;;
  esac
done

REPOS=(pytorch_backend backend core common)
# backend, core and common are always r24.10's: the server API of the embedded tritonserver 2.51
declare -A TAG=([pytorch_backend]=$RELEASE [backend]=r24.10 [core]=r24.10 [common]=r24.10)
declare -A COMMIT=(
  [pytorch_backend]=e97a90061f7399b25368e2cb1f6d5c40f8cbae4e
  [backend]=ac03a5d97403dec841ad46d0439e93db12c9268f
  [core]=bfec7c61dc0939433f64f14e89b1973073eac8ba
  [common]=578491fc3944f77d16a6a38e3d7691c485c47ba0
)
declare -A SHA256=(
  [pytorch_backend]=3bbd9bd9d3254a9f2f1eb6cd9870890443d0541eea7974964efe6b6810895b53
  [backend]=151da6fa28fbece76c7357a72e089768d4322e2382cce8b6b578424a82b4987a
  [core]=a77d172b45f5582fa6a089c894d003cdcd6e81f57d941a196eb4ca93ff7d8a63
  [common]=f8d42fac07949257d938261d3330ced625b33829ac02bac37fa837a4c6f6c57c
)
NAME=pytorch
PATCHES=()
OPTIONS=()
case $RELEASE in
  r24.10) ;;
  r26.05)
    COMMIT[pytorch_backend]=55bbe27ff7b6be1642dbd0d2737c148d0684c3a7
    SHA256[pytorch_backend]=2f1bec4cb1671651e1473ce52928011d2c3961710281848e9f5a1d4ceaddb531
    NAME=torchaoti
    PATCHES=(scripts/patches/r26.05/*.patch)  # <repository>-<what>.patch
    OPTIONS=(-DTRITON_PYTORCH_NVSHMEM=OFF -DTRITON_PYTORCH_OPTREE=OFF)
    ;;
  *) echo "build_pytorch_backend: --release is r24.10 or r26.05, not $RELEASE" >&2; exit 2 ;;
esac

fail() { echo "build_pytorch_backend: $*" >&2; exit 1; }
# run STEP LOG CMD...: run a build step; on failure say which step failed and show the end of its output.
run() {
  local step=$1 log=$2; shift 2
  if ! "$@" >"$log" 2>&1; then
    echo "build_pytorch_backend: the step '$step' failed; its last lines:" >&2
    tail -n 25 "$log" >&2
    echo "build_pytorch_backend: the whole output is in $log" >&2
    exit 1
  fi
}

read -r TORCH_VERSION TORCH_DIR < <("$PY" -c 'import os, torch; print(torch.__version__, os.path.dirname(torch.__file__))') \
  || fail "cannot import torch with $PY; run scripts/setup.sh first."

SOURCES=${TRITONSHIP_TRITON_SOURCES:-}
# the folder holding repository r's archive, or nothing for GitHub
archives() {
  if [[ -n $SOURCES ]]; then echo "$SOURCES"
  elif [[ -d ../shared/third_party/triton-${TAG[$1]} ]]; then echo "../shared/third_party/triton-${TAG[$1]}"
  fi
}
[[ -z $SOURCES || -d $SOURCES ]] || fail "TRITONSHIP_TRITON_SOURCES=$SOURCES is not a folder."
PINS=$(for r in "${REPOS[@]}"; do echo "$r ${TAG[$r]} ${SHA256[$r]} ${COMMIT[$r]} $(archives "$r")"; done)

TARGET=$TOOLS/backends/$NAME
LIBRARY=libtriton_$NAME.so
# What the installed build was made from: torch, the pinned sources and patches, this script, CPU or GPU.
STAMP=$( { echo "$TORCH_VERSION $TORCH_DIR $GPU"; echo "$PINS"; cat "$0" "${PATCHES[@]}"; } | sha256sum | cut -c1-16)
if [[ -f $TARGET/$LIBRARY && "$(cat "$TARGET/.build" 2>/dev/null)" == "$STAMP" ]]; then
  exit 0
fi
echo "setup: building Triton's PyTorch backend ($RELEASE as $NAME, GPU $GPU) against torch $TORCH_VERSION"
started=$SECONDS

work=$(mktemp -d -t tritonship-pytorch-backend-XXXX)
trap 'rm -rf "$work"' EXIT
logs=$TOOLS/logs/$NAME-backend  # kept: a failed step's whole output
rm -rf "$logs" && mkdir -p "$work/src" "$logs"
for r in "${REPOS[@]}"; do
  folder=$(archives "$r")
  if [[ -n $folder ]]; then
    archive=$folder/$r-${TAG[$r]}.tar.gz
    [[ -f $archive ]] || fail "$archive is missing; the folder must hold the archives of triton-${TAG[$r]}."
    echo "${SHA256[$r]}  $archive" | sha256sum --check --status \
      || fail "$archive does not match its pinned SHA-256 (${SHA256[$r]}); fetch it again."
    tar -xzf "$archive" -C "$work/src"
  else
    run "git clone $r" "$logs/clone-$r.log" git clone --quiet --depth 1 --branch "${TAG[$r]}" \
      "https://github.com/triton-inference-server/$r.git" "$work/src/$r"
    got=$(git -C "$work/src/$r" rev-parse HEAD)
    [[ $got == "${COMMIT[$r]}" ]] || fail "GitHub's $r at ${TAG[$r]} is $got, not the pinned ${COMMIT[$r]}."
  fi
done
for patch in "${PATCHES[@]}"; do
  name=$(basename "$patch")
  run "patch $name" "$logs/patch-$name.log" patch -d "$work/src/${name%%-*}" -p1 --forward --no-backup-if-mismatch -i "$PWD/$patch"
done

src=$work/src
# The server process provides the server API (the wheel's libtritonserver.so has another soname than core's
# stub); torch's headers never need Python's; common's tests would download googletest.
sed -i '/triton-core-serverstub/d; s/^find_package(Python3 .*$//' "$src/pytorch_backend/CMakeLists.txt"
sed -i 's/^add_subdirectory(test)$//' "$src/common/src/CMakeLists.txt"
rpath="$TORCH_DIR/lib"
extra=()
if [[ $GPU == ON ]]; then
  sed -i 's/"53;60-real;62-real;70-real;72-real;75-real;/"75-real;/' "$src/backend/CMakeLists.txt"
  sed -i 's/ -Werror//' "$src/backend/CMakeLists.txt" "$src/common/CMakeLists.txt" "$src/core/CMakeLists.txt" \
    "$src/core/src/CMakeLists.txt"
  cu=$("$PY" -c 'import glob, os, torch; print(":".join(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "cu*", "lib"))))')
  [[ -n $cu ]] && rpath="$rpath:$cu"
  extra=(-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}")
  [[ -n ${RapidJSON_DIR:-} ]] && extra+=(-DRapidJSON_DIR="$RapidJSON_DIR")
fi

# the environment's CMake (pyproject's dev extra: r26.05 needs 3.31.8), else the system's
CMAKE=$(dirname "$PY")/cmake
[[ -x $CMAKE ]] || CMAKE=cmake
run "cmake configure" "$logs/configure.log" "$CMAKE" -S "$src/pytorch_backend" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DTRITON_ENABLE_GPU=$GPU -DTRITON_PYTORCH_ENABLE_TORCHVISION=OFF \
  -DTRITON_PYTORCH_INCLUDE_PATHS="$TORCH_DIR/include;$TORCH_DIR/include/torch/csrc/api/include" \
  -DTRITON_PYTORCH_LIB_PATHS="$TORCH_DIR/lib" \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DFETCHCONTENT_SOURCE_DIR_REPO-COMMON="$src/common" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-CORE="$src/core" \
  -DFETCHCONTENT_SOURCE_DIR_REPO-BACKEND="$src/backend" \
  -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath,$rpath" \
  "${OPTIONS[@]}" "${extra[@]}"
# Only the backend target: the install step would copy CUDA libraries that a CPU wheel lacks.
run "compile (ninja triton-pytorch-backend)" "$logs/build.log" "$CMAKE" --build "$work/build" --target triton-pytorch-backend

mkdir -p "$TARGET"
cp "$work/build/libtriton_pytorch.so" "$TARGET/$LIBRARY.tmp"
mv "$TARGET/$LIBRARY.tmp" "$TARGET/$LIBRARY"
echo "$STAMP" >"$TARGET/.build"
echo "setup: Triton's PyTorch backend $RELEASE built in $((SECONDS - started)) s: $TARGET/$LIBRARY"
