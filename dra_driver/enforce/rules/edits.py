"""What a claim's containers get from MPS enforcement (pure): the CDI containerEdits per device
(environment, the namespace pipe mount, the memory-limit hooks) and where pipes live."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.enforce.rules.hooks import (
    consumer_gate_hook,
    memory_env,
    memory_limit_hook,
)
from dra_driver.enforce.rules.names import daemon_pipe_dir, mib
from dra_driver.enforce.rules.targets import FractionTarget, MpsOptions
from dra_driver.model.cdi import ContainerEdits, Mount
from dra_driver.model.vocabulary import ComputeMode, Tier

CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
"""Where the claim's namespace pipe directory appears inside the container."""
PIPE_MOUNT_OPTIONS = ("rbind", "ro", "nosuid", "nodev", "noexec")
"""The namespace pipe directory is mounted read-only: a client connects to the socket in it
(connecting to a unix socket needs no write access to its file system), and a container
cannot put files into the directory the MPS server owns."""


def namespace_pipe_dir(target: FractionTarget, options: MpsOptions) -> str:
    """Host path of the target's namespace pipe directory:
    ``<root>/mps/<mode>/pipe/<server>/<namespace>`` (the MPS v3 layout: NVIDIA MPS docs,
    "MPS v3 Namespaces")."""
    pipe = daemon_pipe_dir(options.mps_root, target.mode)
    return str(pipe / target.server / target.namespace)


def target_edits(
    target: FractionTarget,
    pipe_dir: str | None,
    options: MpsOptions,
    device_key: str | None = None,
) -> ContainerEdits:
    """Pure: the CDI edits of one device of ``target`` (env, the pipe mount, hooks: on every
    MPS tier the consumer gate, on ``hard`` also the memory-limit hook, and the gate records
    the container's cgroup).

    The ``hard`` tier's per-container limits are one consumer's share of the device
    (:func:`device_consumer_mib`; of the whole target without ``device_key``):
    the gate admits at most ``max_consumers`` running containers per device, so together they
    never hold more than the device's share of the claim's ceiling.

    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` mirrors the namespace's SM ceiling when there is one
    (sm-sharing, below 100); in v3 the namespace value wins over the client's (NVIDIA MPS
    docs, "Appendix: Environment Variables"), so it only informs the workload.

    Args:
        target: the claim's target on the device's GPU.
        pipe_dir: host path of the claim's namespace pipe directory (None for tier none).
        options: hook paths and the record directory.
        device_key: the device these edits are for (``DevicePlan.key``); the consumer gate
            counts the containers that get this device (``users/<claim-uid>/<key>``), so that
            containers that each get their own request of one claim (extended resources:
            one request per container) are not counted against each other. None: the claim.
    """
    env = [
        f"GPU_FRACTION_COMPUTE_MODE={target.mode}",
        f"GPU_FRACTION_MEMORY_ENFORCEMENT={target.tier}",
    ]
    if not target.uses_mps or pipe_dir is None:
        return ContainerEdits(env=tuple(env))
    head = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"]
    if target.mode == ComputeMode.SM_SHARING and target.threads < 100:
        head.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={target.threads}")
    env = head + env
    mounts = (Mount(pipe_dir, CONTAINER_PIPE_DIR, PIPE_MOUNT_OPTIONS),)
    records = options.user_record_root / target.claim.uid
    hard = target.tier == Tier.HARD
    gate = consumer_gate_hook(
        str(records / device_key if device_key else records),
        target.max_consumers,
        f"{target.claim.namespace}/{target.claim.name}",
        consumers_advice(target),
        options.record_shell,
        str(options.record_root / target.claim.uid) if hard and options.record_cgroups else "",
    )
    if not hard:
        return ContainerEdits(env=tuple(env), mounts=mounts, hooks=(gate,))
    if device_key is None:
        env.extend(memory_env(target.consumer_request_mib, target.consumer_limit_mib))
    else:
        env.extend(memory_env(*device_consumer_mib(target, device_key)))
    memory = memory_limit_hook(target.gpu.uuid, options.driver_root, options.ctk_hook_path)
    return ContainerEdits(env=tuple(env), mounts=mounts, hooks=(memory, gate))


def device_consumer_mib(target: FractionTarget, key: str) -> tuple[int, int]:
    """Pure: (request, ceiling) in whole MiB that one consumer of the device ``key`` may hold
    on the hard tier: that device's own share, divided among ``max_consumers``. Several devices
    of one claim on one GPU share the claim's MPS namespace (its limit is their sum), but each
    is injected into the containers mapped to its own request (extended resources: one request
    per container), so each container is held to its own share, not the sum
    (kubernetes/kubernetes#134880)."""
    if key in target.device_keys and len(target.device_bytes) == len(target.device_keys):
        request, limit = target.device_bytes[target.device_keys.index(key)]
        limit = min(limit, target.limit_bytes)
        request = min(request, limit)
        return mib(request) // target.max_consumers, mib(limit) // target.max_consumers
    return target.consumer_request_mib, target.consumer_limit_mib


def consumers_advice(target: FractionTarget) -> str:
    """Pure: the end of the consumer gate's refusal: how the claim's ceiling is divided and what
    the user can do, e.g. ``each may hold 17891 MiB of its 17891 MiB ceiling on GPU 0; stop the
    other container, give each pod its own claim (a ResourceClaimTemplate), or raise
    maxConsumers in the claim's GpuFractionParameters (the ceiling is divided among them)``."""
    return (
        f"each may hold {target.consumer_limit_mib} MiB of its {mib(target.limit_bytes)} MiB "
        f"ceiling on GPU {target.gpu.index}; stop the other container, give each pod its own "
        "claim (a ResourceClaimTemplate), or raise maxConsumers in the claim's "
        "GpuFractionParameters (the ceiling is divided among them)"
    )


def claim_edits(
    targets: Sequence[FractionTarget],
    options: MpsOptions,
    pipes: Mapping[str, str] | None = None,
) -> dict[str, ContainerEdits]:
    """Pure: the CDI edits of every device of a claim, keyed by ``DevicePlan.key``.

    Args:
        targets: the claim's targets (:func:`targets_for_claim`).
        options: paths.
        pipes: GPU UUID -> namespace pipe directory as MPS reported it (real node); None to use
            :func:`namespace_pipe_dir` (simulated node).
    """
    out: dict[str, ContainerEdits] = {}
    for t in targets:
        pipe: str | None = None
        if t.uses_mps:
            pipe = namespace_pipe_dir(t, options) if pipes is None else pipes.get(t.gpu.uuid)
        for key in t.device_keys:
            out[key] = target_edits(t, pipe, options, key)
    return out
