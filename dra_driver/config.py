"""Node configuration: which fractions each GPU offers, and how (see ``docs/node-config.md``).

The configuration is one YAML document (``kind: NodeConfig``) read once at plugin start. Every
rule below is checked when it is loaded; a violation raises :class:`ConfigError` whose message
names the file and the field path (e.g. ``node.yaml: products[2].portion: ...``). A field given
as null (``index:`` with no value, ``~``) is an error, never taken as absent; a key given twice
in one mapping is an error naming both lines; a file that cannot be read or is not UTF-8 is an
error naming the file.

Quantities (``capacity.minimum`` ...) use the Kubernetes quantity syntax (``1Gi``, ``256Mi``,
``1073741824``); :func:`parse_bytes` reads them and :func:`canonical_quantity` writes byte counts
back in the canonical form the API server stores, so that published objects compare equal to
what the server returns.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import structlog
import yaml

from dra_driver.gpus.model import MIB, Gpu
from dra_driver.vocabulary import COMPUTE_MODES, FRACTION_MODELS, ComputeMode, FractionModel

API_VERSION = "gpu-fraction.dra.dev/v1alpha1"
"""``apiVersion`` of the node configuration document."""

KIND = "NodeConfig"
"""``kind`` of the node configuration document."""

"""How a GPU is published: fixed-size product devices sharing counters, or one device with
consumable ``memory`` capacity (see ``docs/node-config.md``, "What gets published")."""

"""Compute mode of a GPU: tenants take turns (time-slicing) or run concurrently under MPS."""

RESERVED_PRODUCT_NAMES = frozenset({"memory"})
"""Product names that would collide with the capacity model's DeviceClass (``gpu-memory``)."""

MAX_PRODUCT_NAME_LENGTH = 40
"""Longest product name: keeps device names (``gpu-<index>-<product>-<n>``) and DeviceClass
names (``gpu-<product>-sm-sharing``) within the 63-character DNS label limit."""

MAX_PRODUCTS = 16
"""Most products in one product list."""

MAX_PORTION_DENOMINATOR = 64
"""Largest denominator of a product portion (1/64 of a card is the smallest fraction)."""

MAX_DEVICES_PER_GPU = 64
"""Most product devices one GPU may carry (sum over products of ``floor(1 / portion)``); also
the per-slice device limit, so one GPU's devices always fit one ResourceSlice."""

MAX_SLOTS = 1_000_000
"""Largest least common multiple of a product list's denominators (the ``slots`` counter)."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$"
)
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_SUFFIXES.update({"P": 15, "E": 18})
_BINARY_NAMES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_DECIMAL_NAMES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


log = structlog.get_logger(__name__)


class ConfigError(ValueError):
    """The node configuration is invalid; the message names the source and the field path."""


# --- quantities -----------------------------------------------------------------------------


def quantity_value(text: str) -> Fraction:
    """Exact value of a Kubernetes quantity string (``"1Gi"`` -> 1073741824, ``"500m"`` -> 1/2).

    Raises:
        ValueError: when ``text`` is not a quantity (syntax of k8s.io/apimachinery ``resource``).
    """
    m = _QUANTITY.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 1Gi, 256Mi, 1073741824)")
    number = Fraction(m["num"])
    suffix = m["suffix"] or ""
    if suffix in _BINARY_SUFFIXES:
        return number * Fraction(1024) ** _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def canonical_quantity(value: int, binary: bool = True) -> str:
    """Write a non-negative integer as the API server's canonical quantity string.

    ``binary=True`` gives the BinarySI form for multiples of 1024 (``150754820096`` ->
    ``"143771Mi"``); other values, and all values with ``binary=False``, get the DecimalSI form
    (``8`` -> ``"8"``, ``1500`` -> ``"1500"``, ``15000`` -> ``"15k"``). Either way the server
    parses the string and writes it back unchanged. Rule source: ``Quantity.CanonicalizeBytes``
    in k8s.io/apimachinery ``pkg/api/resource``.

    Raises:
        ValueError: for a negative value.
    """
    if value < 0:
        raise ValueError(f"quantity {value} must not be negative")
    if value == 0:
        return "0"
    if binary and value % 1024 == 0:
        exponent = 0
        while value % 1024 == 0 and exponent < len(_BINARY_NAMES) - 1:
            value //= 1024
            exponent += 1
        return f"{value}{_BINARY_NAMES[exponent]}"
    zeros = 0
    while value % 10 == 0:
        value //= 10
        zeros += 1
    exponent = min(zeros - zeros % 3, 18)
    return f"{value * 10 ** (zeros - exponent)}{_DECIMAL_NAMES[exponent]}"


def parse_bytes(value: object, where: str) -> int:
    """A byte count from YAML: an integer or a quantity string (``"1Gi"``), non-negative, whole.

    Raises:
        ConfigError: naming ``where`` when the value is not a whole, non-negative byte count.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"{where}: must be a quantity such as 1Gi or 256Mi, got {value!r}")
    if isinstance(value, int):
        amount = Fraction(value)
    else:
        try:
            amount = quantity_value(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if amount < 0 or amount.denominator != 1:
        raise ConfigError(f"{where}: {value!r} must be a whole, non-negative number of bytes")
    return int(amount)


# --- configuration records -------------------------------------------------------------------


@dataclass(frozen=True)
class Product:
    """A fixed-size fraction of a GPU offered as its own device.

    Attributes:
        name: DNS label, at most 40 characters, not ``memory``; shows in device names
            (``gpu-0-quarter-1``), the ``product`` attribute and the DeviceClass name.
        portion: share of the card, ``0 < portion <= 1``, denominator at most 64.
    """

    name: str
    portion: Fraction

    @property
    def portion_text(self) -> str:
        """The portion as published in the ``portion`` attribute: ``"1/4"``, ``"1"``."""
        return str(self.portion)

    @property
    def count(self) -> int:
        """How many devices of this product one GPU carries: ``floor(1 / portion)``."""
        return int(1 / self.portion)


@dataclass(frozen=True)
class CapacityPolicy:
    """Request policy of the capacity model's ``memory`` capacity (bytes).

    Attributes:
        minimum: smallest request; smaller requests are rounded up to it by the scheduler.
        step: requests are rounded up to ``minimum + n * step``.
        default: amount a claim gets when it names no ``memory`` request; None means the whole
            card (the largest on-grid amount), so a claim that does not say how much it needs is
            never silently capped below the card.
    """

    minimum: int = 1024 * MIB
    step: int = 256 * MIB
    default: int | None = None


DEFAULT_PRODUCTS = (
    Product("eighth", Fraction(1, 8)),
    Product("quarter", Fraction(1, 4)),
    Product("half", Fraction(1, 2)),
    Product("full", Fraction(1)),
)
"""Products offered when the configuration names none: 8 + 4 + 2 + 1 = 15 devices per GPU."""


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
        compute_mode: ``time-slicing`` or ``sm-sharing``.
        products: the products offered when ``fraction_model`` is ``products``.
        capacity: the request policy used when ``fraction_model`` is ``capacity``.
        enabled: False when the configuration withholds the GPU from the driver.
    """

    fraction_model: str = FractionModel.PRODUCTS
    compute_mode: str = ComputeMode.TIME_SLICING
    products: tuple[Product, ...] = DEFAULT_PRODUCTS
    capacity: CapacityPolicy = CapacityPolicy()
    enabled: bool = True


@dataclass(frozen=True)
class NodeConfig:
    """A validated node configuration; :meth:`for_gpu` resolves it for one GPU."""

    defaults: GpuConfig = GpuConfig()
    gpus: tuple[GpuOverride, ...] = ()

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
    time-slicing, capacity policy minimum 1Gi, step 256Mi, default the whole card."""
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


# --- parsing ---------------------------------------------------------------------------------


class _DuplicateKeyError(yaml.YAMLError):
    """A mapping names one key twice (PyYAML would keep the last silently)."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    Keys merged in with ``<<: *anchor`` may be overridden by an explicit key (that is what
    merge keys are for); only explicit keys are compared.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # SafeLoader reports unhashable keys itself
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise _DuplicateKeyError(
                    f"line {line}: duplicate key {key!r} (first at line {first_line[key]})"
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def load_node_config(path: str | None) -> NodeConfig:
    """Read and validate the node configuration file; ``None`` gives :func:`default_node_config`.

    Raises:
        ConfigError: when the file cannot be read (any ``OSError``), is not UTF-8, is not YAML,
            or breaks a rule; the message starts with the path and names the field.
    """
    if path is None:
        return default_node_config()
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ConfigError(f"{path}: cannot read node configuration: {reason}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} "
            f"(line {line}); save the file as UTF-8"
        ) from None
    return parse_node_config_text(text, source=path)


def parse_node_config_text(text: str, source: str = "<node-config>") -> NodeConfig:
    """Parse YAML text into a :class:`NodeConfig` (see :func:`parse_node_config`).

    Raises:
        ConfigError: for invalid YAML (including a key given twice in one mapping) or an
            invalid configuration, prefixed with ``source``.
    """
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKeyError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    return parse_node_config(data, source=source)


def parse_node_config(data: object, source: str = "<node-config>") -> NodeConfig:
    """Validate an already-loaded YAML document and build the :class:`NodeConfig`.

    Raises:
        ConfigError: ``"<source>: <field path>: <problem>"`` for the first rule broken.
    """
    try:
        return _parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse(data: object) -> NodeConfig:
    doc = _mapping(
        {} if data is None else data,
        "document",
        {"apiVersion", "kind", "defaults", "products", "capacity", "gpus"},
    )
    if doc.get("apiVersion") != API_VERSION:
        raise ConfigError(f"apiVersion: must be {API_VERSION!r}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        raise ConfigError(f"kind: must be {KIND!r}, got {doc.get('kind')!r}")
    defaults = _mapping(doc.get("defaults", {}), "defaults", {"fractionModel", "computeMode"})
    model = _choice(
        defaults.get("fractionModel", FractionModel.PRODUCTS),
        FRACTION_MODELS,
        "defaults.fractionModel",
    )
    mode = _choice(
        defaults.get("computeMode", ComputeMode.TIME_SLICING), COMPUTE_MODES, "defaults.computeMode"
    )
    products = _products(doc["products"], "products") if "products" in doc else DEFAULT_PRODUCTS
    capacity: dict[str, int | None] = {
        "minimum": CapacityPolicy.minimum,
        "step": CapacityPolicy.step,
        "default": CapacityPolicy.default,
    }
    if "capacity" in doc:
        capacity.update(_capacity(doc["capacity"], "capacity"))
    _check_capacity(capacity, "capacity")
    minimum, step = capacity["minimum"], capacity["step"]
    assert minimum is not None and step is not None
    base = GpuConfig(
        fraction_model=model,
        compute_mode=mode,
        products=products,
        capacity=CapacityPolicy(minimum=minimum, step=step, default=capacity["default"]),
    )
    raw_gpus = doc.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise ConfigError(f"gpus: must be a list, got {type(raw_gpus).__name__}")
    overrides = tuple(_override(item, f"gpus[{i}]") for i, item in enumerate(raw_gpus))
    for i, override in enumerate(overrides):
        _check_capacity({**capacity, **override.capacity}, f"gpus[{i}].capacity")
    config = NodeConfig(defaults=base, gpus=overrides)
    _check_product_names_consistent(config)
    return config


def _mapping(value: object, where: str, allowed: set[str]) -> dict[str, Any]:
    """``value`` as a mapping with only ``allowed`` keys; null is not an empty mapping (a
    section with nothing under it is a mistake or an indentation slip)."""
    if not isinstance(value, dict):
        got = "null" if value is None else type(value).__name__
        raise ConfigError(f"{where}: must be a mapping, got {got}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {known})")
    return value


def _choice(value: object, choices: Sequence[str], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices)}, got {value!r}")
    assert isinstance(value, str)
    return value


def _portion(value: object, where: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f'{where}: must be a fraction such as "1/4", got {value!r}')
    try:
        portion = Fraction(str(value).strip())
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f'{where}: {value!r} is not a fraction such as "1/4" or "1"') from None
    if not 0 < portion <= 1:
        raise ConfigError(f"{where}: {value!r} must be greater than 0 and at most 1")
    if portion.denominator > MAX_PORTION_DENOMINATOR:
        raise ConfigError(
            f"{where}: {value!r} has denominator {portion.denominator}; "
            f"at most {MAX_PORTION_DENOMINATOR} is allowed"
        )
    return portion


def _products(value: object, where: str) -> tuple[Product, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: must be a non-empty list of {{name, portion}}")
    if len(value) > MAX_PRODUCTS:
        raise ConfigError(f"{where}: {len(value)} products; at most {MAX_PRODUCTS} are allowed")
    products: list[Product] = []
    for i, raw in enumerate(value):
        item_where = f"{where}[{i}]"
        item = _mapping(raw, item_where, {"name", "portion"})
        name = item.get("name")
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            raise ConfigError(
                f"{item_where}.name: {name!r} must be a DNS label "
                "(lower-case letters, digits and '-', starting and ending alphanumeric)"
            )
        if len(name) > MAX_PRODUCT_NAME_LENGTH:
            raise ConfigError(
                f"{item_where}.name: {name!r} is longer than {MAX_PRODUCT_NAME_LENGTH} characters"
            )
        if name in RESERVED_PRODUCT_NAMES:
            raise ConfigError(f"{item_where}.name: {name!r} is reserved (capacity model class)")
        if any(p.name == name for p in products):
            raise ConfigError(f"{item_where}.name: duplicate product name {name!r}")
        if "portion" not in item:
            raise ConfigError(f"{item_where}.portion: required")
        products.append(Product(name, _portion(item["portion"], f"{item_where}.portion")))
    devices = sum(p.count for p in products)
    if devices > MAX_DEVICES_PER_GPU:
        raise ConfigError(
            f"{where}: these products make {devices} devices per GPU; "
            f"at most {MAX_DEVICES_PER_GPU} are allowed"
        )
    if slots_for(products) > MAX_SLOTS:
        raise ConfigError(
            f"{where}: the portions' common denominator {slots_for(products)} exceeds {MAX_SLOTS}"
        )
    return tuple(products)


def slots_for(products: Sequence[Product]) -> int:
    """Slots one GPU is divided into for these products: the least common multiple of the
    portions' denominators, so that every product consumes a whole number of slots."""
    return math.lcm(*(p.portion.denominator for p in products)) if products else 1


def _capacity(value: object, where: str) -> dict[str, int | None]:
    raw = _mapping(value, where, {"minimum", "step", "default"})
    out: dict[str, int | None] = {}
    for key in ("minimum", "step"):
        if key in raw:
            amount = parse_bytes(raw[key], f"{where}.{key}")
            if amount < MIB:
                raise ConfigError(f"{where}.{key}: {raw[key]!r} must be at least 1Mi")
            out[key] = amount
    if "default" in raw:
        default = raw["default"]
        out["default"] = None if default == "full" else parse_bytes(default, f"{where}.default")
    return out


def _check_capacity(capacity: Mapping[str, int | None], where: str) -> None:
    default, minimum = capacity["default"], capacity["minimum"]
    if default is not None and minimum is not None and default < minimum:
        raise ConfigError(
            f"{where}.default: {canonical_quantity(default)} is below the minimum "
            f"{canonical_quantity(minimum)}"
        )


def _selector(value: object, where: str) -> GpuSelector:
    raw = _mapping(value, where, {"index", "uuid", "product"})
    if not raw:
        raise ConfigError(f"{where}: must name at least one of index, uuid, product")
    # "key present" decides, not "value not None": a null field must not widen the selector
    # to every GPU.
    index = raw.get("index")
    if "index" in raw and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        raise ConfigError(f"{where}.index: must be a non-negative integer, got {index!r}")
    for key in ("uuid", "product"):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise ConfigError(f"{where}.{key}: must be a non-empty string, got {raw[key]!r}")
    return GpuSelector(index=index, uuid=raw.get("uuid"), product=raw.get("product"))


def _override(value: object, where: str) -> GpuOverride:
    allowed = {"selector", "fractionModel", "computeMode", "products", "capacity", "enabled"}
    raw = _mapping(value, where, allowed)
    if "selector" not in raw:
        raise ConfigError(f"{where}.selector: required")
    if len(raw) == 1:
        raise ConfigError(f"{where}: sets nothing besides its selector")
    enabled = raw.get("enabled")
    if "enabled" in raw and not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled: must be true or false, got {enabled!r}")
    return GpuOverride(
        selector=_selector(raw["selector"], f"{where}.selector"),
        fraction_model=(
            _choice(raw["fractionModel"], FRACTION_MODELS, f"{where}.fractionModel")
            if "fractionModel" in raw
            else None
        ),
        compute_mode=(
            _choice(raw["computeMode"], COMPUTE_MODES, f"{where}.computeMode")
            if "computeMode" in raw
            else None
        ),
        products=_products(raw["products"], f"{where}.products") if "products" in raw else None,
        capacity=_capacity(raw["capacity"], f"{where}.capacity") if "capacity" in raw else {},
        enabled=enabled,
    )


def _check_product_names_consistent(config: NodeConfig) -> None:
    """One product name means one portion on every GPU (its DeviceClass is cluster-wide)."""
    portions = {p.name: (p.portion, "products") for p in config.defaults.products}
    for i, override in enumerate(config.gpus):
        for j, p in enumerate(override.products or ()):
            known = portions.setdefault(p.name, (p.portion, f"gpus[{i}].products"))
            if known[0] != p.portion:
                raise ConfigError(
                    f"gpus[{i}].products[{j}].portion: product {p.name!r} is {p.portion} here "
                    f"but {known[0]} in {known[1]}; a product name must mean one portion"
                )
