# The gate step: Triton's SDK image has perf_analyzer of the same release as the servers on the PATH.
# The gate, quality, stage, publish and promote steps import no torch.
# BASE comes from images/versions.yaml (make images); the default is checked against it.
ARG BASE=nvcr.io/nvidia/tritonserver:26.10-py3-sdk
FROM ${BASE}
ARG IMAGE=ghcr.io/tritonship/gate:0.1.0-26.10
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITONSHIP_IMAGE=${IMAGE}
WORKDIR /opt/tritonship
COPY pyproject.toml README.md ./
COPY components ./components
COPY pipelines ./pipelines
COPY images/versions.yaml ./images/versions.yaml
RUN pip install --no-deps . \
 && pip install "numpy>=1.26" "boto3>=1.35" "tritonclient[http,grpc]>=2.51" "protobuf>=4.25" "pyyaml>=6" \
        "typer>=0.12" "rich>=13" "requests>=2.31" "kfp>=2.17,<2.18" "kfp-kubernetes>=2.17,<2.18" \
        "kubernetes>=30" "matplotlib>=3.8" "scipy>=1.11" "savvi>=0.3" "pydantic>=2.7" "pyarrow>=16" \
 && useradd --create-home --uid 10001 tritonship
USER 10001
