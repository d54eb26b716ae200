# syntax=docker/dockerfile:1
# The reactantserver node image: `reactantserver node` runs one worker per GPU it is given
# and the gateway in front (docs/node.md, docs/deployment.md).
#
#   GPU (default):  docker build -t reactantserver:0.1.0 .
#   CPU variant:    docker build -t reactantserver:0.1.0-cpu \
#                     --build-arg BASE_IMAGE=python:3.11-slim-bookworm --build-arg JAX_EXTRA=jax .
#
# jax[cuda12] brings its own CUDA 12 libraries from PyPI; the CUDA runtime base adds the
# NVIDIA container conventions (the driver comes from the host through the NVIDIA runtime).
ARG BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

# cuda -> jax[cuda12]; jax -> the CPU build of JAX.
ARG JAX_EXTRA=cuda

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/reactantserver \
    PATH=/opt/reactantserver/bin:$PATH \
    REACTANT_RUNTIME_DIR=/run/reactantserver

# tini is PID 1: it forwards SIGTERM to the supervisor and reaps orphans. Python comes
# from the base when it has one (python:*-slim), else from the distribution.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini ca-certificates \
    && if ! command -v python3 >/dev/null; then \
         apt-get install -y --no-install-recommends python3 python3-venv; \
       fi \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/reactantserver

WORKDIR /opt/reactantserver/src
COPY pyproject.toml README.md ./
COPY src ./src
# The project itself, from this source tree (its dependencies' ranges are in pyproject.toml).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[${JAX_EXTRA}]" \
    && rm -rf /opt/reactantserver/src

# A user of its own, and the directories it writes: the bundle volume (read), the compile
# cache, and the runtime directory where the supervisor writes its children's files.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/reactantserver reactant \
    && mkdir -p /etc/reactantserver /var/lib/reactantserver/models /var/cache/reactantserver \
       /run/reactantserver \
    && chown -R reactant:reactant /var/lib/reactantserver /var/cache/reactantserver \
       /run/reactantserver
COPY deploy/docker/node.yaml /etc/reactantserver/node.yaml

VOLUME ["/var/lib/reactantserver/models", "/var/cache/reactantserver"]
USER 10001:10001
WORKDIR /var/lib/reactantserver
# The node's public ports: gRPC (KServe V2 / Triton) and /healthz /readyz /metrics.
EXPOSE 8001 8002

# Ready = the node's /readyz answers 200 (workers compile before they are ready, so the
# start period is long; REACTANT_HEALTHCHECK_URL points it elsewhere).
HEALTHCHECK --interval=15s --timeout=5s --start-period=10m --retries=3 \
    CMD ["python3", "-m", "reactantserver.node.healthcheck"]

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["reactantserver", "node", "/etc/reactantserver/node.yaml"]
