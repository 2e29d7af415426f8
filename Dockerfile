# syntax=docker/dockerfile:1
# WindVE service image.
#   CPU:  docker build -t windve:0.1.0 .
#   CUDA: docker build --build-arg VARIANT=cuda -t windve:0.1.0-cuda .
# For a cluster, tag and push it to a registry before `helm install` (docs/deploy.md).
# The CUDA variant takes torch from PyPI, whose Linux wheels carry the CUDA runtime
# libraries (nvidia-* wheels); the node supplies only the driver (NVIDIA container
# toolkit / GPU operator). The bundled model (all-MiniLM-L6-v2) is a PyPI dependency,
# so the image serves without any download at run time.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/windve
ENV PATH=/opt/windve/bin:$PATH
# torch first, from the index that matches the variant, so `pip install .` finds it satisfied.
RUN case "$VARIANT" in \
      cpu)  pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu ;; \
      cuda) pip install "torch==${TORCH_VERSION}" ;; \
      *)    echo "VARIANT must be cpu or cuda, not '${VARIANT}'" >&2; exit 1 ;; \
    esac
WORKDIR /src
COPY . .
# With the onnx engine's runtime (pyproject's extras): onnxruntime's CPU build, or on a GPU its
# CUDA build, which must not be installed beside the CPU one.
RUN case "$VARIANT" in \
      cpu)  pip install ".[onnx]" ;; \
      cuda) pip install ".[onnx-gpu]" ;; \
    esac

FROM ${PYTHON_IMAGE} AS runtime
# libnuma: CPU workers bind their memory to their NUMA node (windve/cpu/numa.py).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 windve \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/windve \
       --shell /usr/sbin/nologin windve
COPY --from=build /opt/windve /opt/windve
ENV PATH=/opt/windve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    WINDVE_HOST=0.0.0.0 \
    WINDVE_PORT=8080
USER 10001:10001
WORKDIR /home/windve
EXPOSE 8080
# /health is 503 until every instance is warm; give model load and warm-up time.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('WINDVE_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["windve"]
# The host comes from WINDVE_HOST above (a flag here would override `docker run -e WINDVE_HOST=::`).
CMD ["serve"]
