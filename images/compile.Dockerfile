# The compile step: export and compile (Torch-TensorRT / TorchScript) on a GPU node.
# torch, torch_tensorrt and TensorRT come from NVIDIA's image and must not be replaced by pip.
# BASE comes from images/versions.yaml (make images); the default is checked against it.
ARG BASE=nvcr.io/nvidia/pytorch:26.10-py3
FROM ${BASE}
ARG IMAGE=ghcr.io/tritonship/compile:0.1.0-26.10
# The serving image's torch (versions.yaml serving_torch): an AOTInductor package loads only in the torch it was
# compiled with, so a base that carries another fails the build here.
ARG TORCH=2.14.0
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITONSHIP_IMAGE=${IMAGE}
WORKDIR /opt/tritonship
RUN python -c "import sys, torch; sys.exit(0 if torch.__version__.startswith('${TORCH}') else \
    f'the base carries torch {torch.__version__}, not ${TORCH} (images/versions.yaml serving_torch)')"
COPY pyproject.toml README.md ./
COPY components ./components
COPY pipelines ./pipelines
COPY images/versions.yaml ./images/versions.yaml
RUN pip install --no-deps . \
 && pip install "boto3>=1.35" "tritonclient[grpc]>=2.51" "protobuf>=4.25" "pyyaml>=6" "typer>=0.12" "rich>=13" \
        "requests>=2.31" "kfp>=2.17,<2.18" "kfp-kubernetes>=2.17,<2.18" "pydantic>=2.7" \
 && useradd --create-home --uid 10001 tritonship
USER 10001
