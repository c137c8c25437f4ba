"""Node configuration model (pure): which fractions each GPU offers, and how
(``docs/node-config.md``).

Immutable records (:class:`NodeConfig`, :class:`GpuConfig`, products, capacity policy, per-GPU
overrides) and the rules that resolve them per GPU. Reading and validating the YAML document
is :mod:`dra_driver.config.load`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import structlog

from dra_driver.config.params import ClaimLimits
from dra_driver.model.gpu import MIB, Gpu
from dra_driver.model.vocabulary import AUTO_COMPUTE_MODE, COMPUTE_MODES, ComputeMode, FractionModel

API_VERSION = "gpu-fraction.dra.dev/v1alpha1"
"""``apiVersion`` of the node configuration document."""

KIND = "NodeConfig"
"""``kind`` of the node configuration document."""

"""How a GPU is published: fixed-size product devices sharing counters, or one device with
consumable ``memory`` capacity (see ``docs/node-config.md``, "What gets published")."""

"""Compute mode of a GPU: tenants take turns (time-slicing) or run concurrently under MPS."""

MAX_PRODUCT_NAME_LENGTH = 40
"""Longest product name: keeps extended-resource device names (``gpu-<index>-<mode>-<product>``)
and DeviceClass names (``gpu-<product>-sm-sharing``) within the 63-character DNS label limit."""

MAX_PRODUCTS = 10
"""Most products in one product list: their sizes become the ``validValues`` of the device's
``slots`` capacity, which Kubernetes caps at 10 entries (``CapacityRequestPolicy``)."""

MAX_PORTION_DENOMINATOR = 64
"""Largest denominator of a product portion (1/64 of a card is the smallest fraction)."""

MAX_SLOTS = 1_000_000
"""Largest ``slotsPerGpu``: the ``slots`` capacity of one GPU."""


log = structlog.get_logger(__name__)


# --- configuration records -------------------------------------------------------------------


@dataclass(frozen=True)
class Product:
    """A fixed-size fraction of a GPU: ``portion * slotsPerGpu`` slots of its shared device.

    Attributes:
        name: DNS label, at most 40 characters, not ``memory``; shows in the DeviceClass name
            and, with extended resources, in a device name (``gpu-0-time-slicing-quarter``) and
            its ``product`` attribute.
        portion: share of the card, ``0 < portion <= 1``, denominator at most 64.
    """

    name: str
    portion: Fraction

    @property
    def portion_text(self) -> str:
        """The portion as published in the ``portion`` attribute: ``"1/4"``, ``"1"``."""
        return str(self.portion)


@dataclass(frozen=True)
class CapacityPolicy:
    """Request policy of the capacity model's ``memory`` capacity (bytes).

    Attributes:
        minimum: smallest request; smaller requests are rounded up to it by the scheduler.
        step: requests are rounded up to ``minimum + n * step``.
        default: amount a claim gets when it names no ``memory`` request; None means
            ``minimum``: quota counts a claim as one device whatever it consumes, so a claim
            that does not say how much it needs gets the least, never the card.
    """

    minimum: int = 1024 * MIB
    step: int = 256 * MIB
    default: int | None = None


WHOLE_CARD = 2**63 - 1
"""``capacity.default: full``: more than any card, so the policy's default is its largest
on-grid amount (:func:`dra_driver.publish.offer.capacity_request_policy`)."""


DEFAULT_PRODUCTS = (
    Product("eighth", Fraction(1, 8)),
    Product("quarter", Fraction(1, 4)),
    Product("half", Fraction(1, 2)),
    Product("full", Fraction(1)),
)
"""Products offered when the configuration names none: 1, 2, 4 and 8 of 8 slots."""


@dataclass(frozen=True)
class GpuSelector:
    """Which GPUs a ``gpus[]`` override applies to; every field given must match.

    Attributes:
        index: NVML index (``Gpu.index``).
        uuid: NVML UUID (``Gpu.uuid``), exact.
        product: product name as NVML reports it (``Gpu.name``), exact, e.g. ``NVIDIA H200``.
    """

    index: int | None = None
    uuid: str | None = None
    product: str | None = None

    def matches(self, gpu: Gpu) -> bool:
        """Whether ``gpu`` satisfies every field of the selector."""
        return (
            (self.index is None or gpu.index == self.index)
            and (self.uuid is None or gpu.uuid == self.uuid)
            and (self.product is None or gpu.name == self.product)
        )

    def __str__(self) -> str:
        """The fields given, as in the file: ``{index: 0, product: NVIDIA H200}``."""
        fields = (("index", self.index), ("uuid", self.uuid), ("product", self.product))
        return "{" + ", ".join(f"{k}: {v}" for k, v in fields if v is not None) + "}"


@dataclass(frozen=True)
class GpuOverride:
    """One ``gpus[]`` entry: settings for the GPUs its selector matches (None = unchanged)."""

    selector: GpuSelector
    fraction_model: str | None = None
    compute_mode: str | None = None
    products: tuple[Product, ...] | None = None
    capacity: Mapping[str, int | None] = field(default_factory=dict)
    enabled: bool | None = None


@dataclass(frozen=True)
class GpuConfig:
    """The effective settings of one GPU (defaults, then every matching override in order).

    Attributes:
        fraction_model: ``products`` or ``capacity``.
        compute_mode: ``auto`` (default: the mode follows the claims, see :attr:`modes`),
            ``time-slicing`` or ``sm-sharing`` (pinned).
        products: the products offered when ``fraction_model`` is ``products``.
        capacity: the request policy used when ``fraction_model`` is ``capacity``.
        enabled: False when the configuration withholds the GPU from the driver.
    """

    fraction_model: str = FractionModel.PRODUCTS
    compute_mode: str = AUTO_COMPUTE_MODE
    products: tuple[Product, ...] = DEFAULT_PRODUCTS
    capacity: CapacityPolicy = CapacityPolicy()
    enabled: bool = True

    @property
    def modes(self) -> tuple[ComputeMode, ...]:
        """The compute modes the GPU is offered in: both for ``auto`` (the mode follows the
        claims), else the pinned one."""
        if self.compute_mode == AUTO_COMPUTE_MODE:
            return COMPUTE_MODES
        return (ComputeMode(self.compute_mode),)


@dataclass(frozen=True)
class NodeConfig:
    """A validated node configuration; :meth:`for_gpu` resolves it for one GPU.

    Attributes:
        defaults: settings of every GPU before overrides.
        gpus: per-GPU overrides, in file order.
        slots_per_gpu: the ``slots`` capacity of one GPU (``slotsPerGpu``); None: the least
            common multiple of every product's denominator (8 for the default products).
        extended_resources: publish, per GPU, mode and product, a device that an extended
            resource request (``gpu-fraction.dra.dev/quarter: 1``) can take
            (``extendedResources``).
        claim_limits: the node's default caps on what a claim may ask (``claimLimits``),
            for claims whose class sets none; without a memory cap a claim's ceiling is its
            request (no burst into its neighbours' memory).
    """

    defaults: GpuConfig = GpuConfig()
    gpus: tuple[GpuOverride, ...] = ()
    slots_per_gpu: int | None = None
    extended_resources: bool = False
    claim_limits: ClaimLimits = ClaimLimits()

    @property
    def slots(self) -> int:
        """Slots one GPU is divided into: ``slots_per_gpu`` or the products' common
        denominator. A product of portion ``p`` takes ``p * slots`` of them."""
        return self.slots_per_gpu or slots_for(self.all_products())

    def for_gpu(self, gpu: Gpu) -> GpuConfig:
        """Effective settings of ``gpu``: the defaults, then each matching override (later wins).

        Capacity fields are merged one by one (an override setting only ``step`` keeps the
        default ``minimum``). A merged ``default`` below ``minimum`` (possible only when several
        overrides stack) is raised to ``minimum``.
        """
        cfg = self.defaults
        capacity: dict[str, int | None] = {
            "minimum": cfg.capacity.minimum,
            "step": cfg.capacity.step,
            "default": cfg.capacity.default,
        }
        model, mode, products, enabled = (
            cfg.fraction_model,
            cfg.compute_mode,
            cfg.products,
            cfg.enabled,
        )
        for override in self.gpus:
            if not override.selector.matches(gpu):
                continue
            model = override.fraction_model or model
            mode = override.compute_mode or mode
            products = override.products if override.products is not None else products
            enabled = override.enabled if override.enabled is not None else enabled
            capacity.update(override.capacity)
        minimum, step, default = capacity["minimum"], capacity["step"], capacity["default"]
        assert minimum is not None and step is not None
        if default is not None:
            default = max(default, minimum)
        return GpuConfig(
            fraction_model=model,
            compute_mode=mode,
            products=products,
            capacity=CapacityPolicy(minimum=minimum, step=step, default=default),
            enabled=enabled,
        )

    def unmatched_selectors(self, gpus: Iterable[Gpu]) -> tuple[str, ...]:
        """One message per ``gpus[]`` entry whose selector matches none of ``gpus``.

        Such an entry has no effect on this node: usually a typo in a UUID or product name (the
        product must be spelled as NVML reports it, ``NVIDIA H200``), or a file shared by nodes
        with different GPUs. Not an error, since one file serves every node; the plugin logs
        each as a warning (:func:`warn_unmatched_selectors`).
        """
        present = tuple(gpus)
        return tuple(
            f"gpus[{i}].selector {override.selector} matches no GPU on this node"
            for i, override in enumerate(self.gpus)
            if not any(override.selector.matches(gpu) for gpu in present)
        )

    def all_products(self) -> tuple[Product, ...]:
        """Every product any GPU may offer (defaults first, then overrides), unique by name."""
        seen: dict[str, Product] = {p.name: p for p in self.defaults.products}
        for override in self.gpus:
            for p in override.products or ():
                seen.setdefault(p.name, p)
        return tuple(seen.values())


def default_node_config() -> NodeConfig:
    """The configuration used without a file: products eighth/quarter/half/full on every GPU,
    compute mode ``auto`` (follows the claims), capacity policy minimum 1Gi, step 256Mi,
    default the minimum."""
    return NodeConfig()


def warn_unmatched_selectors(
    config: NodeConfig, gpus: Iterable[Gpu], source: str | None = None
) -> tuple[str, ...]:
    """Log a warning for each ``gpus[]`` entry that matches none of ``gpus`` (the node's
    discovered GPUs) and return the messages (:meth:`NodeConfig.unmatched_selectors`).

    Args:
        config: the node configuration.
        gpus: the GPUs discovered on this node (``Inventory.gpus``).
        source: the configuration file, for the log entry (``node_config``).
    """
    found = config.unmatched_selectors(gpus)
    for message in found:
        log.warning(
            "node configuration entry matches no GPU; it has no effect",
            node_config=source,
            entry=message.split(".", 1)[0],
            detail=message,
        )
    return found


def slots_for(products: Sequence[Product]) -> int:
    """Slots one GPU is divided into for these products: the least common multiple of the
    portions' denominators, so that every product consumes a whole number of slots."""
    return math.lcm(*(p.portion.denominator for p in products)) if products else 1
