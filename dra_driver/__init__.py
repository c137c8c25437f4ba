"""A Kubernetes DRA driver that shares NVIDIA GPUs as memory-capped fractions."""

DEFAULT_DRIVER_NAME = "gpu-fraction.dra.dev"
"""The DRA driver name: ResourceSlice ``spec.driver``, CDI vendor, registration name."""

__all__ = ["DEFAULT_DRIVER_NAME"]
