"""A simulated GPU inventory for machines without NVIDIA GPUs (tests, the demo, CI).

Spec grammar: ``simulated:<MODEL>x<COUNT>[,<MODEL>x<COUNT>...][@<DRIVER_VERSION>]``, e.g.
``simulated:H200x8``, ``simulated:V100-32GBx4``, ``simulated:H200x2,A100-80GBx2``,
``simulated:L4x1@580.95.05``. Values per model follow what NVML reports on real cards; a
GPU's memory is the card's total (the MiB ``nvidia-smi`` shows) minus the memory the driver
reserves for itself, as on a real node (see :data:`PROFILES`).

A node runs one driver. Without ``@<DRIVER_VERSION>`` it is :data:`DEFAULT_DRIVER_VERSION`, or
the last driver branch of the oldest card listed when that is older (a V100 holds its node at
R580); naming a driver newer than a card's last branch is an error, as such a node cannot
exist.
"""

from __future__ import annotations

import re
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from dra_driver.model.errors import StartupError
from dra_driver.model.gpu import MIB, NVML_INIT_FAILED, Gpu, GpuSourceError, Inventory

DEFAULT_DRIVER_VERSION = "615.71.09"
"""r615 driver (CUDA 13.4): the first with MPS v3 and per-container memory limits."""


LAST_VOLTA_DRIVER = "580.95.05"
"""An R580 driver: R580 (CUDA 13.0) is the last branch for Volta and Pascal GPUs; CUDA 13
removed their support from the toolkit and later branches do not drive them."""


@dataclass(frozen=True)
class GpuProfile:
    """Per-model constants of a simulated GPU.

    Attributes:
        name: product name as NVML reports it.
        memory_mib: the card's total as ``nvidia-smi`` shows it (NVML v1/v2 ``total``), MiB.
        reserved_mib: memory the driver reserves for itself (NVML v2 ``reserved``), MiB;
            the GPU offers ``memory_mib - reserved_mib`` (see
            :func:`dra_driver.gpus.nvml.usable_memory_bytes`).
        sm_count, compute_capability, architecture, mig_enabled: as NVML reports them.
        last_driver: the newest driver version the card runs, when its branch is older than
            :data:`DEFAULT_DRIVER_VERSION`'s (None: no limit).
    """

    name: str
    memory_mib: int
    reserved_mib: int
    sm_count: int
    compute_capability: str
    architecture: str
    mig_enabled: bool = False
    last_driver: str | None = None


PROFILES: dict[str, GpuProfile] = {
    "H200": GpuProfile("NVIDIA H200", 143771, 640, 132, "9.0", "hopper"),
    "H100-80GB": GpuProfile("NVIDIA H100 80GB HBM3", 81559, 580, 132, "9.0", "hopper"),
    "A100-80GB": GpuProfile("NVIDIA A100-SXM4-80GB", 81920, 600, 108, "8.0", "ampere"),
    "A100-40GB": GpuProfile("NVIDIA A100-SXM4-40GB", 40960, 540, 108, "8.0", "ampere"),
    "A100-80GB-MIG": GpuProfile("NVIDIA A100-SXM4-80GB", 81920, 600, 108, "8.0", "ampere", True),
    "L4": GpuProfile("NVIDIA L4", 23034, 450, 58, "8.9", "ada-lovelace"),
    "V100-32GB": GpuProfile(
        "Tesla V100-SXM2-32GB", 32768, 480, 80, "7.0", "volta", last_driver=LAST_VOLTA_DRIVER
    ),
    "P100-16GB": GpuProfile(
        "Tesla P100-PCIE-16GB", 16384, 450, 56, "6.0", "pascal", last_driver=LAST_VOLTA_DRIVER
    ),
}
"""Known simulated models, keyed by the name used in a spec.

``reserved_mib`` values are ESTIMATES, not measurements: a few hundred MiB per card, the order
reported for a T4 (about 450 MiB, KAI Scheduler issue #2212), somewhat more on the larger
cards. Replace them with ``nvidia-smi -q`` "FB Memory Usage / Reserved" readings when known.
"""

_CUDA_FOR_DRIVER = ((615, "13.4"), (580, "13.0"), (570, "12.8"), (550, "12.4"), (535, "12.2"))
_PART = re.compile(r"^(?P<model>[A-Za-z0-9-]+?)x(?P<count>[0-9]+)$")


class SimulatedSpecError(StartupError, ValueError):
    """A ``simulated:`` spec that cannot be parsed; the message says what is wrong."""


def cuda_version_for_driver(driver_version: str) -> str:
    """Return the CUDA driver API version a given NVIDIA driver branch ships (e.g. 615 -> 13.4)."""
    branch = int(driver_version.split(".", 1)[0])
    for minimum, cuda in _CUDA_FOR_DRIVER:
        if branch >= minimum:
            return cuda
    return "12.0"


def _branch(driver_version: str) -> int:
    return int(driver_version.split(".", 1)[0])


def node_driver(models: list[str], requested: str) -> str:
    """The driver version of a node with ``models`` (keys of :data:`PROFILES`): ``requested``,
    or when empty the default held back to the oldest card's last branch.

    Raises:
        SimulatedSpecError: when ``requested`` is newer than a card's last branch.
    """
    limits: dict[str, str] = {}
    for model in models:
        last = PROFILES[model].last_driver
        if last is not None:
            limits[model] = last
    if not requested:
        return min([DEFAULT_DRIVER_VERSION, *limits.values()], key=_branch)
    for model, last in limits.items():
        if _branch(requested) > _branch(last):
            raise SimulatedSpecError(
                f"{model} runs driver branches up to R{_branch(last)}; driver {requested} does "
                f"not support it (drop @{requested} to get {last})"
            )
    return requested


def parse_spec(spec: str) -> tuple[list[tuple[GpuProfile, int]], str]:
    """Parse a ``simulated:...`` spec into ``([(profile, count), ...], driver_version)``.

    Raises:
        SimulatedSpecError: unknown prefix, model, bad count, empty spec, a bad driver version
            or one newer than a listed card's last branch.
    """
    if not spec.startswith("simulated:"):
        raise SimulatedSpecError(f"GPU spec {spec!r} must start with 'simulated:'")
    body = spec.removeprefix("simulated:")
    body, _, driver = body.partition("@")
    if driver and not re.fullmatch(r"[0-9]{3}\.[0-9]+(\.[0-9]+)?", driver):
        raise SimulatedSpecError(f"driver version {driver!r} must look like 615.71.09")
    parts: list[tuple[GpuProfile, int]] = []
    models: list[str] = []
    for raw in filter(None, body.split(",")):
        m = _PART.match(raw.strip())
        if not m:
            raise SimulatedSpecError(f"{raw!r} must be <MODEL>x<COUNT>, e.g. H200x8")
        model, count = m["model"], int(m["count"])
        if model not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise SimulatedSpecError(f"unknown simulated GPU model {model!r}; known: {known}")
        if count < 1 or count > 64:
            raise SimulatedSpecError(f"count in {raw!r} must be between 1 and 64")
        parts.append((PROFILES[model], count))
        models.append(model)
    if not parts:
        raise SimulatedSpecError(f"GPU spec {spec!r} names no GPUs")
    return parts, node_driver(models, driver)


class SimulatedGpuSource:
    """A :class:`~dra_driver.model.gpu.GpuSource` built from a ``simulated:`` spec.

    UUIDs are derived from ``seed`` (use the node name) and the index, so they are stable
    across restarts and distinct between nodes.

    Raises:
        SimulatedSpecError: from the constructor when the spec is invalid.
    """

    def __init__(
        self,
        spec: str,
        seed: str = "sim",
        lost_file: Path | None = None,
        unloaded_file: Path | None = None,
        reloaded_file: Path | None = None,
    ) -> None:
        self._parts, self._driver = parse_spec(spec)
        self._seed = seed
        self._lost_file = lost_file
        self._unloaded_file = unloaded_file
        self._reloaded_file = reloaded_file
        self.vanished: set[int] = set()
        """Indexes to report as gone on the next discovery (to simulate a lost GPU)."""

    def lost(self) -> set[int]:
        """Indexes reported as gone: :attr:`vanished` plus those listed (whitespace-separated)
        in ``lost_file``, which lets a test take a GPU away from a running plugin. An
        unreadable or malformed file counts as empty."""
        listed: set[int] = set()
        if self._lost_file is not None:
            try:
                listed = {int(x) for x in self._lost_file.read_text().split()}
            except (OSError, ValueError):
                listed = set()
        return self.vanished | listed

    def minor_offset(self) -> int:
        """What ``reloaded_file`` holds (an integer, e.g. ``16``): the driver was reloaded and
        numbers its device nodes from there (``/dev/nvidia<index + offset>``); 0 without the
        file. An unreadable or malformed file counts as 0."""
        if self._reloaded_file is None:
            return 0
        try:
            return max(0, int(self._reloaded_file.read_text().strip() or "0"))
        except (OSError, ValueError):
            return 0

    def discover(self) -> Inventory:
        """Return the simulated GPUs in index order (minus any lost, see :meth:`lost`).

        Raises:
            GpuSourceError: ``unloaded_file`` exists: the NVIDIA driver is not loaded, and the
                error is the one :class:`~dra_driver.gpus.nvml.NvmlGpuSource` raises when
                ``nvmlInit`` fails with NVML's ``Driver Not Loaded``.
        """
        if self._unloaded_file is not None and self._unloaded_file.exists():
            raise GpuSourceError(f"{NVML_INIT_FAILED}: Driver Not Loaded")
        gpus: list[Gpu] = []
        index = 0
        cuda = cuda_version_for_driver(self._driver)
        lost = self.lost()
        offset = self.minor_offset()
        for profile, count in self._parts:
            for _ in range(count):
                if index not in lost:
                    gpus.append(self._gpu(profile, index, cuda, offset))
                index += 1
        return Inventory(gpus=tuple(gpus))

    def _gpu(self, profile: GpuProfile, index: int, cuda: str, offset: int) -> Gpu:
        uid = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"simulated-gpu/{self._seed}/{index}")
        bus = 0x18 + index * 0x10 if index < 14 else index
        return Gpu(
            index=index,
            minor=index + offset,
            uuid=f"GPU-{uid}",
            name=profile.name,
            memory_bytes=(profile.memory_mib - profile.reserved_mib) * MIB,
            sm_count=profile.sm_count,
            compute_capability=profile.compute_capability,
            architecture=profile.architecture,
            pci_bus_id=f"0000:{bus:02x}:00.0",
            mig_enabled=profile.mig_enabled,
            driver_version=self._driver,
            cuda_driver_version=cuda,
        )
