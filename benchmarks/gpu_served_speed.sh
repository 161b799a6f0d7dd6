#!/usr/bin/env bash
# Served speed on the lent GPU machine: the embedded Triton (a CUDA build), its Python backend stub for
# Python 3.12 and perf_analyzer travel there compressed, with the Python packages that machine lacks, and
# Triton's r24.10 and r26.05 sources with RapidJSON's headers: unpack builds both PyTorch backends there with
# TRITON_ENABLE_GPU=ON against that machine's torch (scripts/build_pytorch_backend.sh --gpu [--release r26.05]).
#
#   bash benchmarks/gpu_served_speed.sh pack   # here: writes .gpu/{tools,stub312,site312}.tar.xz (~77 MB)
#   bash benchmarks/gpu_served_speed.sh run    # there, from the repo root (see benchmarks/README.md)
#   bash benchmarks/gpu_served_speed.sh backend   # there: the GPU build of the PyTorch backend and its gpu tests
#   bash benchmarks/gpu_served_speed.sh tests     # there: every gpu-marked test
#   bash benchmarks/gpu_served_speed.sh bert4rec fp16 [--forms torchscript,eager] [--protocols http,grpc] [--instances 1x4 2x4]   # there: the users' BERT4Rec ensemble
#   bash benchmarks/gpu_served_speed.sh gate --injections 0:10,25:5   # there: the gate on the GPU
#   bash benchmarks/gpu_served_speed.sh hops --precision fp16 --concurrency 1 16 64 --rates 10000   # there: the ensemble's hops
#   bash benchmarks/gpu_served_speed.sh floor --precision fp16   # there: one call of the model step and its GPU busy time
#   bash benchmarks/gpu_served_speed.sh aoti   # there: the users' BERT4Rec as torch_aoti against TorchScript, one server
#   bash benchmarks/gpu_served_speed.sh pytest -k instance_count tests/test_aoti.py   # there: any tests
#   bash benchmarks/gpu_served_speed.sh release_start --rate 50000   # there: the release as the pipeline runs it
#   bash benchmarks/gpu_served_speed.sh release_wait                 # there, the next call: waits on it
#
# One device call carries at most 64 MiB, so the packs travel in two calls to the same warm machine:
# `bash benchmarks/gpu_served_speed.sh unpack` with only .gpu/site312.tar.xz and .gpu/stub312.tar.xz
# carried (it unpacks them and stops), then the command wanted with .gpu/tools.tar.xz (it unpacks the
# tools, then measures); either order works. They are unpacked outside the repository
# (/tmp/tritonship-gpu), which a warm machine keeps between calls; the carried .gpu/ is replaced each
# call. Results and logs go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PLATFORMS="--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"

pack() {
  local tmp
  tmp=$(mktemp -d)
  mkdir -p .gpu
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLATFORMS --target "$tmp/site312" boto3==1.44.8 botocore==1.44.8 s3transfer==0.19.3 jmespath==1.1.0 \
    tritonclient==2.73.0 protobuf==6.33.6 python-rapidjson==1.25 gevent==26.9.0 geventhttpclient==2.6.1 \
    greenlet==3.5.6 brotli==1.2.1 zope.event==6.2 zope.interface==8.7 moto==5.2.5 flask==3.1.3 \
    flask-cors==6.0.5 blinker==1.9.0 itsdangerous==2.2.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
    responses==0.26.3 xmltodict==1.0.4 werkzeug==3.1.9 pydantic==2.14.4 pydantic_core==2.50.5 \
    annotated-types==0.8.0 typing-inspection==0.4.5 savvi==0.3.1 py-markdown-table==2.0.0
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLATFORMS --target "$tmp/stub312" numpy==1.26.4
  tar -cJf .gpu/site312.tar.xz -C "$tmp" site312
  tar -cJf .gpu/stub312.tar.xz -C "$tmp" stub312
  # The backend's sources and RapidJSON (headers and a CMake config that points at them) for the GPU build.
  mkdir -p "$tmp/backend-src/rapidjson/include"
  cp -r ../shared/third_party/triton-r24.10 "$tmp/backend-src/"
  cp ../shared/third_party/triton-r26.05/pytorch_backend-r26.05.tar.gz "$tmp/backend-src/triton-r24.10/"
  cp -r /usr/include/rapidjson "$tmp/backend-src/rapidjson/include/"
  printf 'set(RAPIDJSON_INCLUDE_DIRS "${CMAKE_CURRENT_LIST_DIR}/include")\nset(RapidJSON_INCLUDE_DIRS "${RAPIDJSON_INCLUDE_DIRS}")\n' \
    > "$tmp/backend-src/rapidjson/RapidJSONConfig.cmake"
  tar -cJf .gpu/stub312.tar.xz -C "$tmp" stub312 backend-src
  (cd .tools && tar -cf - pytriton/tritonserver/bin pytriton/tritonserver/backends pytriton/tritonserver/caches \
    pytriton/tritonserver/python_backend_stubs/3.12 nvidia_pytriton.libs --exclude='libpython3-*' \
    bin/perf_analyzer nvidia/cuda_runtime/lib/libcudart.so.12) | xz -9 -T0 > .gpu/tools.tar.xz
  rm -rf "$tmp"
  ls -l .gpu/*.tar.xz
}

# Unpacks what the call carried (site packages and stub first, the tools in the next call) and sets the
# environment; returns non-zero when the tools have not arrived yet.
unpack() {
  local unpacked=/tmp/tritonship-gpu
  tools=$unpacked/tools
  if [ -f .gpu/site312.tar.xz ] && [ ! -d "$unpacked/site" ]; then
    mkdir -p "$unpacked/site" "$tools/stub-site"
    tar -xJf .gpu/site312.tar.xz -C "$unpacked/site" --strip-components=1
    tar -xJf .gpu/stub312.tar.xz -C "$unpacked" stub312 backend-src
    cp -r "$unpacked"/stub312/. "$tools/stub-site/"
  fi
  if [ -f .gpu/tools.tar.xz ] && [ ! -x "$tools/bin/perf_analyzer" ]; then
    mkdir -p "$tools"
    tar -xJf .gpu/tools.tar.xz -C "$tools"
    # perf_analyzer links libb64.so.0d, which setup.sh installs with apt here; the server's copy serves.
    ln -sf "$tools"/nvidia_pytriton.libs/libb64-*.so.0d "$tools/nvidia/cuda_runtime/lib/libb64.so.0d"
  fi
  if [ ! -x "$tools/bin/perf_analyzer" ] || [ ! -d "$unpacked/site" ]; then
    echo "unpacked what came; now run again carrying the other packs (.gpu/tools.tar.xz or the site and stub ones)"
    return 1
  fi
  export TRITONSHIP_TOOLS=$tools PYTHONPATH=$PWD:$unpacked/site PYTHONUNBUFFERED=1
  # The image's CXX is /opt/gcc's g++, whose libstdc++ is not the one torch loads: an AOTInductor package built
  # with it crashes the process that loads it (SIGSEGV). Inductor falls back to the system's g++.
  unset CXX
  for release in r24.10 r26.05; do
    TRITONSHIP_TRITON_SOURCES=$unpacked/backend-src/triton-r24.10 RapidJSON_DIR=$unpacked/backend-src/rapidjson \
      bash scripts/build_pytorch_backend.sh --release $release --gpu --python python3 --tools "$tools" 2>&1 \
      | tee -a "$OUT/backend_build.log"
  done
  nvidia-smi -L | tee "$OUT/machine.txt"
}

# Copies the results this call wrote (newer than unpack's machine.txt) to $OUT: the committed ones stay,
# and a call brings back only so many files.
fetch() {
  find benchmarks/results -name "$1" -newer "$OUT/machine.txt" -exec cp {} "$OUT/" \;
}

run() {
  unpack || exit 0
  python3 benchmarks/served_speed.py --device cuda --concurrency 1 16 --repeats 3 2>&1 \
    | grep -v "DEBUG\|frombuffer\|UserWarning" | tee "$OUT/served_speed.log"
  fetch "served_speed_cuda_*.json"
  python3 -m pytest -p no:cacheprovider -m gpu -k gpu_instance tests/test_compile_gpu.py 2>&1 \
    | tee "$OUT/pytest_gpu_served.log"
}

# The PyTorch backend's GPU build (made by unpack) serving the compile step's CUDA TorchScript on KIND_GPU
# instances, fp32 and fp16, answers checked against eager (the gpu-marked test).
backend() {
  unpack || exit 0
  python3 -m pytest -p no:cacheprovider -m gpu -k gpu_instance tests/test_compile_gpu.py 2>&1 \
    | tee "$OUT/pytest_gpu_backend.log"
}

# Every gpu-marked test: CUDA TorchScript served by the backend's GPU build, and the ensemble release test.
tests() {
  unpack || exit 0
  python3 -m pytest -p no:cacheprovider -m gpu --durations=10 tests/test_compile_gpu.py tests/test_aoti.py tests/test_ensemble.py tests/test_latency_injection.py 2>&1 | tee "$OUT/pytest_gpu_h200.log"
}

# The users' BERT4Rec ensemble released and served default against tuned (benchmarks/gpu_bert4rec.py), one
# precision per call: `bert4rec fp16 [--forms torchscript,eager ...]`; `bert4rec test` runs the gpu-marked ensemble release test.
# LIMIT_S=N stops it after N seconds with SIGINT, so the embedded stack still shuts down and the results
# written so far (the JSON is rewritten after every config) still come back.
bert4rec() {
  unpack || exit 0
  if [ "$1" = test ]; then
    timeout -s INT -k 20 "${LIMIT_S:-0}" python3 -m pytest -p no:cacheprovider -m gpu -k bert4rec tests/test_ensemble.py 2>&1 | tee "$OUT/pytest_gpu_bert4rec.log"
    return
  fi
  local precision=$1
  shift
  timeout -s INT -k 20 "${LIMIT_S:-0}" python3 benchmarks/gpu_bert4rec.py --precision "$precision" "$@" 2>&1 \
    | grep -v "DEBUG\|frombuffer\|UserWarning\|torch.__trace" | tee -a "$OUT/gpu_bert4rec_$precision.log" || true
  fetch "gpu_bert4rec_cuda_${precision}*_pytorch_backend.json"  # written after every config
}

# The ensemble against the model with its steps folded in (benchmarks/ensemble_hops.py), the users' size;
# arguments go to it: `hops --precision fp16 --concurrency 1 16 64`.
hops() {
  unpack || exit 0
  python3 benchmarks/ensemble_hops.py --device cuda --size users "$@" 2>&1 \
    | grep -v "DEBUG\|frombuffer\|UserWarning\|torch.__trace" | tee -a "$OUT/ensemble_hops.log" || true
  fetch "ensemble_hops_cuda_*.json"
}

# One call of the model step: compiled, eager, with fused attention, and the GPU time of each (benchmarks/model_floor.py);
# arguments go to it: `floor --precision fp16`.
floor() {
  unpack || exit 0
  python3 benchmarks/model_floor.py --device cuda "$@" 2>&1 \
    | grep -v "DEBUG\|frombuffer\|UserWarning\|torch.__trace\|USDT" | tee -a "$OUT/model_floor.log" || true
  fetch "model_floor_cuda_*.json"
}

# The users' BERT4Rec, the model and the folded release, as torch_aoti and as TorchScript on one server
# (benchmarks/gpu_aoti.py), after the gpu-marked tests of both backends (`AOTI_TESTS=0` leaves them out);
# arguments go to it. LIMIT_S=N stops the benchmark as bert4rec's does.
aoti() {
  unpack || exit 0
  if [ "${AOTI_TESTS:-1}" = 1 ]; then
    python3 -m pytest -p no:cacheprovider -m gpu --durations=5 tests/test_aoti.py tests/test_compile_gpu.py 2>&1 \
      | tee "$OUT/pytest_gpu_aoti.log" || true
    python3 -m pytest -p no:cacheprovider -k instance_count tests/test_aoti.py 2>&1 | tee -a "$OUT/pytest_gpu_aoti.log" || true
  fi
  timeout -s INT -k 20 "${LIMIT_S:-0}" python3 benchmarks/gpu_aoti.py "$@" 2>&1 \
    | grep -v "DEBUG\|frombuffer\|UserWarning\|torch.__trace\|USDT\|loss_type" | tee -a "$OUT/gpu_aoti.log" || true
  fetch "gpu_aoti_cuda_*.json"
}

# The users' BERT4Rec released as the pipeline runs it, then production measured (benchmarks/gpu_release.py; arguments
# go to it). It outlasts one device call (10 minutes), so it runs in a session of its own (setsid), which the warm
# machine keeps: `release_start ARGS` unpacks, starts it and waits; `release_wait`, the next call to the same machine
# (within its 30 s warm), waits on. Each brings back what it has written so far. LIMIT_S=N stops it after N s (SIGINT).
RELEASE_DIR=/tmp/tritonship-gpu/release
release_start() {
  unpack || exit 0
  mkdir -p "$RELEASE_DIR"
  rm -f "$RELEASE_DIR/done"
  cp "$OUT/machine.txt" "$OUT/backend_build.log" "$RELEASE_DIR/" 2>/dev/null || true
  setsid bash -c "timeout -s INT -k 30 ${LIMIT_S:-1200} python3 benchmarks/gpu_release.py --out $RELEASE_DIR $* \
    > $RELEASE_DIR/gpu_release.log 2>&1; echo \$? > $RELEASE_DIR/done" < /dev/null > /dev/null 2>&1 &
  release_wait
}

release_wait() {
  # until WAIT_S seconds after this call's script began (the unpacking and building counted)
  while [ ! -f "$RELEASE_DIR/done" ] && [ $SECONDS -lt "${WAIT_S:-570}" ]; do sleep 5; done
  cp "$RELEASE_DIR"/*.json "$RELEASE_DIR"/*.log "$RELEASE_DIR"/machine.txt "$OUT/" 2>/dev/null || true
  grep -v "DEBUG\|frombuffer\|UserWarning\|torch.__trace\|USDT\|loss_type" "$RELEASE_DIR/gpu_release.log" | tail -c 9000 || true
  if [ -f "$RELEASE_DIR/done" ]; then echo "finished: exit $(cat "$RELEASE_DIR/done")"; else echo "still running"; fi
}

# Any tests there, in the unpacked environment: `pytest -k instance_count tests/test_aoti.py`.
pytest() {
  unpack || exit 0
  python3 -m pytest -p no:cacheprovider --durations=5 "$@" 2>&1 | tee -a "$OUT/pytest.log"
}

# The gate's A/A and +25% trials on the GPU (benchmarks/gate_quality.py --gpu); arguments go to it.
gate() {
  unpack || exit 0
  python3 benchmarks/gate_quality.py --gpu --designs duet --out "$OUT/gate_quality_gpu_pytorch_backend.json" "$@" 2>&1 \
    | grep -v "DEBUG\|frombuffer\|UserWarning\|torch.__trace" | tee "$OUT/gate_quality_gpu_pytorch_backend.log"
}

"$@"
