# syntax=docker/dockerfile:1
# The apportion worker image: the built-in trainer (python -m apportion.runtime.workers.trainer under
# torchrun), the workload helpers user scripts import, and the `apportion` command itself (the
# same image runs the scheduler in deploy/).
#
#   docker build -t apportion-worker:0.1.0 .                                  # CPU (gloo)
#   docker build --build-arg VARIANT=cuda -t apportion-worker:0.1.0-cuda .    # CUDA (nccl)
#
# CUDA: PyTorch's CUDA wheels carry the CUDA runtime, cuDNN and NCCL as pip packages, so the
# base stays python-slim; the driver comes from the node (NVIDIA container toolkit / GPU
# operator). TORCH_CUDA picks the wheel index (cu126, cu128, ...) matching the nodes' drivers.
ARG PYTHON=3.11
FROM python:${PYTHON}-slim

ARG VARIANT=cpu
ARG TORCH=2.13.0
ARG TORCH_CUDA=cu128
ARG EXTRAS=k8s,serve

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from the index of the chosen variant, so nothing later pulls another build
RUN set -eu; \
    case "$VARIANT" in \
      cpu)  index="https://download.pytorch.org/whl/cpu" ;; \
      cuda) index="https://download.pytorch.org/whl/${TORCH_CUDA}" ;; \
      *) echo "VARIANT must be cpu or cuda, got $VARIANT" >&2; exit 2 ;; \
    esac; \
    pip install --index-url "$index" "torch==${TORCH}"

WORKDIR /opt/apportion
COPY pyproject.toml README.md ./
COPY apportion ./apportion
COPY formulations ./formulations
COPY solvers ./solvers
COPY estimation ./estimation
COPY runtime ./runtime
COPY experiments ./experiments
RUN pip install ".[${EXTRAS}]" && python -c "import apportion.runtime.workers.trainer, torch; print(torch.__version__)"

# an unprivileged user; checkpoints and progress files go to the volume mounted at /checkpoints
RUN useradd --create-home --uid 10001 apportion && mkdir -p /checkpoints \
    && chown apportion /checkpoints
USER 10001
WORKDIR /workspace
ENV APPORTION_VARIANT=${VARIANT}
LABEL org.opencontainers.image.title="apportion-worker" \
      org.opencontainers.image.description="apportion's training worker and scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"
# no entrypoint: pods run `torchrun ... -m apportion.runtime.workers.trainer CONFIG`, or
# `apportion serve` / `apportion run` (deploy/)
CMD ["apportion", "--help"]
