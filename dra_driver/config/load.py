"""Loading and validating the node configuration (``kind: NodeConfig``; docs/node-config.md).

Every rule is checked when the document is loaded; a violation raises :class:`ConfigError` whose
message names the file and the field path (e.g. ``node.yaml: products[2].portion: ...``). A
field given as null (``index:`` with no value, ``~``) is an error, never taken as absent; a key
given twice in one mapping is an error naming both lines; a file that cannot be read or is not
UTF-8 is an error naming the file. Quantities use :mod:`dra_driver.model.quantities`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from dra_driver.config.classnames import product_name_problem
from dra_driver.config.node import (
    API_VERSION,
    DEFAULT_PRODUCTS,
    KIND,
    MAX_PORTION_DENOMINATOR,
    MAX_PRODUCTS,
    MAX_SLOTS,
    WHOLE_CARD,
    CapacityPolicy,
    GpuConfig,
    GpuOverride,
    GpuSelector,
    NodeConfig,
    Product,
    default_node_config,
    slots_for,
)
from dra_driver.config.node import (
    MAX_PRODUCT_NAME_LENGTH as MAX_NAME,
)
from dra_driver.config.params import CAP_FIELDS, ClaimLimits, ParameterError, parse_limits
from dra_driver.config.strictyaml import DuplicateKeyError, strict_yaml
from dra_driver.model.errors import StartupError
from dra_driver.model.gpu import MIB
from dra_driver.model.ids import is_dns_label
from dra_driver.model.quantities import QuantityError, canonical_quantity, quantity_value
from dra_driver.model.textlimits import shorten
from dra_driver.model.vocabulary import (
    AUTO_COMPUTE_MODE,
    COMPUTE_MODE_SETTINGS,
    FRACTION_MODELS,
    FractionModel,
)


class ConfigError(StartupError, ValueError):
    """The node configuration is invalid; the message names the source and the field path."""


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
        except QuantityError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if amount < 0 or amount.denominator != 1:
        raise ConfigError(f"{where}: {value!r} must be a whole, non-negative number of bytes")
    return int(amount)


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
        data = strict_yaml(text)
    except DuplicateKeyError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    except (ValueError, RecursionError) as exc:  # PyYAML's int() digit limit, deep nesting
        raise ConfigError(f"{source}: not valid YAML: {shorten(str(exc))}") from None
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
        {
            "apiVersion",
            "kind",
            "defaults",
            "products",
            "capacity",
            "gpus",
            "slotsPerGpu",
            "extendedResources",
            "claimLimits",
        },
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
        defaults.get("computeMode", AUTO_COMPUTE_MODE),
        COMPUTE_MODE_SETTINGS,
        "defaults.computeMode",
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
    config = NodeConfig(
        defaults=base,
        gpus=overrides,
        slots_per_gpu=_slots_per_gpu(doc["slotsPerGpu"]) if "slotsPerGpu" in doc else None,
        extended_resources=_flag(doc.get("extendedResources", False), "extendedResources"),
        claim_limits=_claim_limits(doc.get("claimLimits", {})),
    )
    _check_product_names_consistent(config)
    _check_slots(config)
    return config


def _claim_limits(value: object) -> ClaimLimits:
    raw = _mapping(value, "claimLimits", set(CAP_FIELDS))
    try:
        return parse_limits(raw, "claimLimits")
    except ParameterError as exc:
        raise ConfigError(str(exc)) from None


def _slots_per_gpu(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise ConfigError(f"slotsPerGpu: must be an integer in 1..{MAX_SLOTS}, got {value!r}")
    return value


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, got {value!r}")
    return value


def _check_slots(config: NodeConfig) -> None:
    """Every product must be a whole number of slots, or its DeviceClass could not name its
    size (the admission policy writes ``portion * slots`` into each claim); the slots, given or
    the common denominator of every GPU's products, are at most ``MAX_SLOTS``."""
    if config.slots > MAX_SLOTS:
        raise ConfigError(
            f"slotsPerGpu: the products' common denominator {config.slots} exceeds {MAX_SLOTS}; "
            "use portions with smaller denominators"
        )
    for product in config.all_products():
        if (product.portion * config.slots).denominator != 1:
            raise ConfigError(
                f"slotsPerGpu: {config.slots} slots cannot hold product {product.name!r} "
                f"({product.portion} of a GPU) in whole slots; use a multiple of "
                f"{product.portion.denominator}"
            )


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
        if not isinstance(name, str) or not is_dns_label(name) or len(name) > MAX_NAME:
            raise ConfigError(
                f"{item_where}.name: {name!r} must be a DNS label of at most {MAX_NAME} "
                "characters (lower-case letters, digits and '-', starting and ending alphanumeric)"
            )
        if problem := product_name_problem(name):
            raise ConfigError(f"{item_where}.name: {name!r} {problem}")
        if any(p.name == name for p in products):
            raise ConfigError(f"{item_where}.name: duplicate product name {name!r}")
        if "portion" not in item:
            raise ConfigError(f"{item_where}.portion: required")
        products.append(Product(name, _portion(item["portion"], f"{item_where}.portion")))
    if slots_for(products) > MAX_SLOTS:
        raise ConfigError(
            f"{where}: the portions' common denominator {slots_for(products)} exceeds {MAX_SLOTS}"
        )
    return tuple(products)


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
        out["default"] = (
            WHOLE_CARD if default == "full" else parse_bytes(default, f"{where}.default")
        )
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
            _choice(raw["computeMode"], COMPUTE_MODE_SETTINGS, f"{where}.computeMode")
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
