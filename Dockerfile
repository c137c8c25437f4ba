# syntax=docker/dockerfile:1.7
# Image of the gpu-fraction.dra.dev kubelet plugin (`dra-driver kubelet-plugin`).
#
#   docker build -t <registry>/gpu-fraction-dra:0.1.0 .
#
# The same content as `make image` (hack/build-image, i.e. devtools/buildimage/, which needs
# neither Docker nor a registry): the build stage runs `hack/build-image --rootfs-only`, which
# makes the root filesystem with mmdebstrap from the Debian bookworm packages pinned in
# devtools/image-packages.txt and adds the wheels pinned by version and sha256 in
# requirements-image.txt (the runtime closure of pyproject.toml; a test checks the direct
# pins), with fixed file times and byte code compiled with hash-based invalidation. The final
# image is that file tree and nothing else: the debian:bookworm stage only provides the tools
# (mmdebstrap, apt, dpkg, python3, pip), so its tag needs no digest. There is no shell in the
# image.
#
# UNTESTED WITH DOCKER: written where no Docker daemon could run; `make image` builds and
# tests the same root filesystem. If a pinned Debian version has been superseded, the build
# fails and says how to update devtools/image-packages.txt.
FROM --platform=linux/amd64 docker.io/library/debian:bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip mmdebstrap gcc libc6-dev
WORKDIR /src
COPY pyproject.toml requirements-image.txt ./
COPY hack/build-image hack/
COPY devtools/__init__.py devtools/image-packages.txt devtools/
COPY devtools/buildimage devtools/buildimage
COPY dra_driver ./dra_driver
RUN python3 hack/build-image --rootfs-only /out

FROM scratch
COPY --from=build /out /
LABEL org.opencontainers.image.title="gpu-fraction-dra" \
      org.opencontainers.image.description="Kubernetes DRA driver that shares NVIDIA GPUs as memory-capped fractions" \
      org.opencontainers.image.version="0.1.0"
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /
# Root, on purpose: the plugin sets GPU compute modes and per-cgroup GPU memory limits
# through NVML (CAP_SYS_ADMIN), runs the MPS control daemons multi-user as root so that
# tenants of any UID can connect, and writes sockets and CDI specs into root-owned host
# directories (/var/lib/kubelet/plugins*, /var/run/cdi). A non-root user with capabilities
# would still need CAP_SYS_ADMIN and CAP_DAC_OVERRIDE, i.e. root in all but name. The
# DaemonSet confines the rest: read-only root filesystem, only the driver's own host paths.
USER 0:0
ENTRYPOINT ["dra-driver"]
CMD ["--help"]
