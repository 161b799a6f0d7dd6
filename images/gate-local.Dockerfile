# The gate step where the Triton SDK image cannot be pulled (make images-local): the local tools image plus
# perf_analyzer from the tritonclient wheel of the embedded stack's release, with the CUDA runtime library it
# links (it runs on CPU too). BASE and PERF_ANALYZER come from images/versions.yaml `local`.
ARG BASE=localhost/tritonship/tools:0.1.0-local
FROM ${BASE}
ARG IMAGE=localhost/tritonship/gate:0.1.0-local
ARG PERF_ANALYZER=2.51.0
USER 0
RUN apt-get update \
 && apt-get install -y --no-install-recommends "libb64-0d=1.2-5+b1" \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir --no-deps --target /opt/perf_analyzer "tritonclient==${PERF_ANALYZER}" "nvidia-cuda-runtime-cu12==12.*" \
 && ln -s /opt/perf_analyzer/bin/perf_analyzer /usr/local/bin/perf_analyzer
ENV LD_LIBRARY_PATH=/opt/perf_analyzer/nvidia/cuda_runtime/lib TRITONSHIP_IMAGE=${IMAGE}
USER 10001
