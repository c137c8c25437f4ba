"""Pure decision: the health of every device the node has published.

A device is UNHEALTHY when its GPU left the inventory (NVML no longer lists it or cannot
read it) or when enforcement on its GPU failed its last check (MPS daemon or server down
and not yet repaired); otherwise HEALTHY. Devices of a lost GPU stay in the report, so the
kubelet can show the problem on the pods that use them, instead of silently turning Unknown.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_driver.model.devices import DeviceStatus, PublishedDevice


def device_health(
    current: Mapping[str, PublishedDevice],
    seen: Mapping[str, PublishedDevice],
    unhealthy_gpus: Mapping[str, str],
) -> dict[str, DeviceStatus]:
    """Health per device name.

    Args:
        current: devices of the latest inventory, by name.
        seen: every device published since start, by name (a superset of ``current``).
        unhealthy_gpus: GPU UUID -> reason, for GPUs whose enforcement check failed.
    """
    out: dict[str, DeviceStatus] = {}
    for name, device in seen.items():
        gpu = device.gpu
        if name not in current:
            out[name] = DeviceStatus(
                False, f"GPU {gpu.index} ({gpu.uuid}) is no longer in the node's GPU inventory"
            )
        elif gpu.uuid in unhealthy_gpus:
            out[name] = DeviceStatus(
                False, f"enforcement on GPU {gpu.index} failed: {unhealthy_gpus[gpu.uuid]}"
            )
        else:
            out[name] = DeviceStatus(True, f"GPU {gpu.index} present")
    return out
