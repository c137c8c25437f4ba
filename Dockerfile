# syntax=docker/dockerfile:1.7
# Image of the gpu-fraction.dra.dev kubelet plugin (`dra-driver kubelet-plugin`).
#
#   docker build -t <registry>/gpu-fraction-dra:0.1.0 .
#
# Reproducible: the base image is pinned by digest, every Python package (direct and
# transitive) by version, the build backend by pyproject.toml, and byte code is compiled
# with hash-based invalidation (no timestamps).
#
# PLACEHOLDER DIGEST: the all-zero digest below must be replaced with the real digest of the
# tag before the first build (it could not be resolved where this file was written):
#   docker buildx imagetools inspect docker.io/library/python:3.11-slim-trixie
# or pass --build-arg PYTHON_IMAGE=docker.io/library/python:3.11-slim-trixie@sha256:<digest>.
ARG PYTHON_IMAGE=docker.io/library/python:3.11-slim-trixie@sha256:0000000000000000000000000000000000000000000000000000000000000000

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1
# Runtime dependency closure, pinned (direct pins equal pyproject.toml; a test checks it).
COPY <<CONSTRAINTS /tmp/constraints.txt
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiohttp-retry==2.9.1
aiosignal==1.4.0
annotated-types==0.8.0
attrs==26.1.0
certifi==2026.10.19.post1
charset-normalizer==3.5.3
durationpy==0.11
frozenlist==1.8.0
grpcio==1.85.1
idna==3.20
kubernetes==37.0.2
multidict==7.2.1
nvidia-ml-py==13.615.71
oauthlib==4.0.1
prometheus-client==0.26.0
propcache==0.5.4
protobuf==7.36.2
pydantic==2.14.4
pydantic-core==2.50.5
python-dateutil==4.0.0
pyyaml==6.0.3
requests==2.34.2
requests-oauthlib==2.0.0
structlog==26.1.0
typing-extensions==4.16.0
typing-inspection==0.4.5
tzdata==2026.6
urllib3==2.8.0
websocket-client==1.9.2
yarl==1.25.1
CONSTRAINTS
WORKDIR /src
COPY pyproject.toml ./
COPY dra_driver ./dra_driver
# A venv without pip/setuptools: the runtime image carries only the driver and its deps.
RUN python -m venv --without-pip /opt/dra-driver \
 && pip --python /opt/dra-driver/bin/python install --no-cache-dir --no-compile \
        --constraint /tmp/constraints.txt . \
 && /opt/dra-driver/bin/python -m compileall -q --invalidation-mode unchecked-hash \
        /opt/dra-driver/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpu-fraction-dra" \
      org.opencontainers.image.description="Kubernetes DRA driver sharing NVIDIA GPUs as memory-capped fractions" \
      org.opencontainers.image.version="0.1.0"
COPY --from=build /opt/dra-driver /opt/dra-driver
ENV PATH=/opt/dra-driver/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Root, on purpose: the plugin sets GPU compute modes and per-cgroup GPU memory limits
# through NVML (CAP_SYS_ADMIN), runs the MPS control daemons multi-user as root so that
# tenants of any UID can connect, and writes sockets and CDI specs into root-owned host
# directories (/var/lib/kubelet/plugins*, /var/run/cdi). A non-root user with capabilities
# would still need CAP_SYS_ADMIN and CAP_DAC_OVERRIDE, i.e. root in all but name. The
# DaemonSet confines the rest: read-only root filesystem, only the driver's own host paths.
USER 0:0
ENTRYPOINT ["dra-driver"]
CMD ["--help"]
