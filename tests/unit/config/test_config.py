"""Node configuration: defaults, overrides, validation errors naming the field, quantities."""

from __future__ import annotations

import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
import structlog
import structlog.testing
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.config.load import (
    ConfigError,
    load_node_config,
    parse_bytes,
    parse_node_config_text,
)
from dra_driver.config.node import (
    API_VERSION,
    DEFAULT_PRODUCTS,
    WHOLE_CARD,
    GpuConfig,
    GpuSelector,
    NodeConfig,
    Product,
    slots_for,
    warn_unmatched_selectors,
)
from dra_driver.gpus import MIB, Gpu, SimulatedGpuSource
from dra_driver.model.quantities import canonical_quantity, quantity_value
from tests.support.paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "docs" / "examples" / "node-config.example.yaml"
GIB = 1024 * MIB
HEAD = f"apiVersion: {API_VERSION}\nkind: NodeConfig\n"


def parse(body: str) -> NodeConfig:
    return parse_node_config_text(HEAD + textwrap.dedent(body), source="test.yaml")


def gpus(spec: str = "simulated:H200x2,A100-80GBx2") -> list[Gpu]:
    return list(SimulatedGpuSource(spec, seed="node-a").discover().gpus)


def test_no_file_gives_defaults() -> None:
    config = load_node_config(None)
    for gpu in gpus():
        cfg = config.for_gpu(gpu)
        assert cfg.fraction_model == "products"
        assert cfg.compute_mode == "auto"  # the mode follows the claims
        assert cfg.modes == ("time-slicing", "sm-sharing")
        assert [(p.name, p.portion_text) for p in cfg.products] == [
            ("eighth", "1/8"),
            ("quarter", "1/4"),
            ("half", "1/2"),
            ("full", "1"),
        ]
        assert cfg.capacity.minimum == GIB
        assert cfg.capacity.step == 256 * MIB
        assert cfg.capacity.default is None
        assert cfg.enabled
    assert config.slots == 8 and config.slots_per_gpu is None
    assert config.extended_resources is False  # opt-in: no extended resource name claimed


def test_minimal_file_equals_defaults() -> None:
    assert parse("") == NodeConfig()


def test_example_manifest_parses_and_applies(tmp_path: Path) -> None:
    config = load_node_config(str(EXAMPLE))
    h200 = gpus("simulated:H200x2,A100-80GBx1")
    first, second, a100 = h200[0], h200[1], h200[2]
    assert config.for_gpu(first).compute_mode == "time-slicing"
    assert config.for_gpu(second).compute_mode == "sm-sharing"
    assert [p.name for p in config.for_gpu(first).products] == ["sixteenth", "quarter", "full"]
    assert [p.name for p in config.for_gpu(a100).products] == ["eighth", "quarter", "half", "full"]
    assert [p.name for p in config.all_products()] == [
        "eighth",
        "quarter",
        "half",
        "full",
        "sixteenth",
    ]


def test_overrides_apply_in_order_later_wins() -> None:
    g = gpus()
    config = parse(
        f"""
        defaults: {{computeMode: sm-sharing}}
        gpus:
          - selector: {{product: NVIDIA H200}}
            fractionModel: capacity
            computeMode: time-slicing
          - selector: {{index: 1}}
            computeMode: sm-sharing
          - selector: {{uuid: {g[3].uuid}}}
            products: [{{name: third, portion: "1/3"}}]
          - selector: {{index: 2, product: NVIDIA H200}}
            enabled: false
        """
    )
    got = [config.for_gpu(x) for x in g]
    assert [(c.fraction_model, c.compute_mode) for c in got] == [
        ("capacity", "time-slicing"),
        ("capacity", "sm-sharing"),
        ("products", "sm-sharing"),
        ("products", "sm-sharing"),
    ]
    assert got[3].products == (Product("third", Fraction(1, 3)),)
    assert got[2].products == DEFAULT_PRODUCTS
    # index 2 is an A100: the combined selector does not match it
    assert all(c.enabled for c in got)


def test_capacity_merges_field_by_field() -> None:
    config = parse(
        """
        capacity: {minimum: 2Gi, step: 512Mi, default: 4Gi}
        gpus:
          - selector: {index: 0}
            capacity: {step: 1Gi, default: full}
        """
    )
    g = gpus()
    assert config.for_gpu(g[0]).capacity.minimum == 2 * GIB
    assert config.for_gpu(g[0]).capacity.step == GIB
    assert config.for_gpu(g[0]).capacity.default == WHOLE_CARD
    assert config.for_gpu(g[1]).capacity.step == 512 * MIB
    assert config.for_gpu(g[1]).capacity.default == 4 * GIB


def test_stacked_overrides_raise_default_to_minimum() -> None:
    config = parse(
        """
        gpus:
          - selector: {index: 0}
            capacity: {default: 2Gi}
          - selector: {product: NVIDIA H200}
            capacity: {minimum: 4Gi}
        """
    )
    assert config.for_gpu(gpus()[0]).capacity.default == 4 * GIB


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("bogus: 1\n", "document: unknown field(s) bogus"),
        ("defaults: {fractionModel: slices}\n", "defaults.fractionModel: must be one of"),
        ("defaults: {computeMode: mps}\n", "defaults.computeMode: must be one of"),
        ("defaults: {computMode: sm-sharing}\n", "defaults: unknown field(s) computMode"),
        ("products: []\n", "products: must be a non-empty list"),
        ("products: [{name: Quarter, portion: 1/4}]\n", "products[0].name: 'Quarter' must be"),
        ("products: [{name: a_b, portion: 1/4}]\n", "products[0].name: 'a_b' must be a DNS label"),
        (f"products: [{{name: {'x' * 41}, portion: 1/4}}]\n", "products[0].name: 'xxx"),
        ("products: [{name: memory, portion: 1/4}]\n", "products[0].name: 'memory' is reserved"),
        (
            "products: [{name: a, portion: 1/4}, {name: a, portion: 1/2}]\n",
            "products[1].name: duplicate product name 'a'",
        ),
        ("products: [{name: a}]\n", "products[0].portion: required"),
        ("products: [{name: a, portion: 0}]\n", "products[0].portion: 0 must be greater than 0"),
        ("products: [{name: a, portion: 3/2}]\n", "products[0].portion: '3/2' must be greater"),
        ("products: [{name: a, portion: half}]\n", "products[0].portion: 'half' is not a fraction"),
        ("products: [{name: a, portion: 1/0}]\n", "products[0].portion: '1/0' is not a fraction"),
        ("products: [{name: a, portion: 1/65}]\n", "products[0].portion: '1/65' has denominator"),
        ("products: [{name: a, portion: true}]\n", "products[0].portion: must be a fraction"),
        (
            "products: [" + ", ".join(f"{{name: p{i}, portion: 1}}" for i in range(11)) + "]\n",
            "products: 11 products; at most 10",  # validValues holds at most 10 sizes
        ),
        ("capacity: {minimum: 1Ki}\n", "capacity.minimum: '1Ki' must be at least 1Mi"),
        ("capacity: {step: lots}\n", "capacity.step: 'lots' is not a Kubernetes quantity"),
        ("capacity: {step: 1.5}\n", "capacity.step: must be a quantity"),
        ("capacity: {default: 512Mi}\n", "capacity.default: 512Mi is below the minimum 1Gi"),
        ("capacity: {minimum: 0.5Ki}\n", "capacity.minimum: '0.5Ki' must be at least 1Mi"),
        ("capacity: {minimum: 1.0000001Gi}\n", "must be a whole, non-negative number of bytes"),
        ("gpus: {index: 0}\n", "gpus: must be a list"),
        ("gpus: [{computeMode: sm-sharing}]\n", "gpus[0].selector: required"),
        ("gpus: [{selector: {index: 0}}]\n", "gpus[0]: sets nothing besides its selector"),
        ("gpus: [{selector: {}, enabled: false}]\n", "gpus[0].selector: must name at least one"),
        ("gpus: [{selector: {index: -1}, enabled: false}]\n", "gpus[0].selector.index: must be"),
        ("gpus: [{selector: {index: '0'}, enabled: false}]\n", "gpus[0].selector.index: must be"),
        ("gpus: [{selector: {uuid: ''}, enabled: false}]\n", "gpus[0].selector.uuid: must be"),
        ("gpus: [{selector: {name: x}, enabled: false}]\n", "gpus[0].selector: unknown field"),
        ("gpus: [{selector: {index: 0}, enabled: 'no'}]\n", "gpus[0].enabled: must be true or"),
        (
            "gpus: [{selector: {index: 0}, computeMode: exclusive}]\n",
            "gpus[0].computeMode: must be one of auto, time-slicing, sm-sharing",
        ),
        (
            "gpus: [{selector: {index: 0}, products: [{name: a, portion: 2}]}]\n",
            "gpus[0].products[0].portion",
        ),
        (
            "gpus: [{selector: {index: 0}, capacity: {default: 1Mi}}]\n",
            "gpus[0].capacity.default: 1Mi is below the minimum 1Gi",
        ),
        (
            "gpus: [{selector: {index: 0}, products: [{name: quarter, portion: 1/3}]}]\n",
            "gpus[0].products[0].portion: product 'quarter' is 1/3 here but 1/4 in products",
        ),
    ],
)
def test_errors_name_the_field(body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_node_config_text(HEAD + body, source="node.yaml")
    assert str(err.value).startswith("node.yaml: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: NodeConfig\n", "apiVersion: must be 'gpu-fraction.dra.dev/v1alpha1'"),
        (f"apiVersion: {API_VERSION}\nkind: Other\n", "kind: must be 'NodeConfig'"),
        ("- a\n- b\n", "document: must be a mapping"),
        ("a: [\n", "not valid YAML"),
        ("", "apiVersion: must be"),
    ],
)
def test_document_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^n.yaml: ") as err:
        parse_node_config_text(text, source="n.yaml")
    assert message in str(err.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read node configuration"):
        load_node_config(str(missing))


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_portion_forms() -> None:
    config = parse(
        """
        products:
          - {name: a, portion: 0.25}
          - {name: b, portion: "3/8"}
          - {name: c, portion: 1}
          - {name: d, portion: "0.125"}
        """
    )
    portions = [p.portion for p in config.defaults.products]
    assert portions == [Fraction(1, 4), Fraction(3, 8), Fraction(1), Fraction(1, 8)]
    assert slots_for(config.defaults.products) == 8
    assert config.slots == 8  # each a whole number of slots: 2, 3, 8, 1


# --- slotsPerGpu, computeMode auto, extendedResources ------------------------------------


def test_slots_per_gpu_defaults_to_the_common_denominator_of_every_product() -> None:
    config = parse(
        """
        products: [{name: quarter, portion: 1/4}, {name: full, portion: 1}]
        gpus:
          - selector: {index: 1}
            products: [{name: third, portion: 1/3}]
        """
    )
    assert config.slots_per_gpu is None
    assert config.slots == 12  # lcm(4, 1, 3): every product in whole slots on every GPU


def test_explicit_slots_per_gpu() -> None:
    config = parse("slotsPerGpu: 64\n")
    assert config.slots_per_gpu == 64 and config.slots == 64


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "slotsPerGpu: 12\n",  # the default products: eighth is 1.5 of 12 slots
            "slotsPerGpu: 12 slots cannot hold product 'eighth' (1/8 of a GPU) in whole slots; "
            "use a multiple of 8",
        ),
        (
            "slotsPerGpu: 8\ngpus: [{selector: {index: 0}, products: [{name: third, "
            "portion: 1/3}]}]\n",
            "slotsPerGpu: 8 slots cannot hold product 'third' (1/3 of a GPU)",
        ),
        ("slotsPerGpu: 0\n", "slotsPerGpu: must be an integer in 1..1000000, got 0"),
        ("slotsPerGpu: 1000001\n", "slotsPerGpu: must be an integer in 1..1000000"),
        ("slotsPerGpu: '8'\n", "slotsPerGpu: must be an integer in 1..1000000, got '8'"),
        ("slotsPerGpu: true\n", "slotsPerGpu: must be an integer"),
        ("extendedResources: 'yes'\n", "extendedResources: must be true or false, got 'yes'"),
    ],
)
def test_slots_per_gpu_errors(body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_node_config_text(HEAD + body, source="node.yaml")
    assert str(err.value).startswith("node.yaml: ")
    assert message in str(err.value)


def test_common_denominator_over_every_gpu_is_bounded() -> None:
    """Each list alone is within 1,000,000 slots, together they are not: the node's slots
    (the least common multiple over every product) must be refused, not published."""
    body = (
        "products: [{name: a, portion: 30/61}, {name: b, portion: 29/59}, "
        "{name: c, portion: 26/53}]\n"
        "gpus: [{selector: {index: 0}, products: [{name: d, portion: 23/47}, "
        "{name: e, portion: 21/43}, {name: f, portion: 20/41}]}]\n"
    )
    with pytest.raises(ConfigError, match="slotsPerGpu: .* exceeds 1000000"):
        parse_node_config_text(HEAD + body, source="node.yaml")


def test_small_products_are_a_few_sizes_not_many_devices() -> None:
    """A GPU publishes one device per mode whatever the portions; 1/64 and 1/32 are sizes 1 and
    2 of 64 slots (before the new layout they made 96 devices and were refused)."""
    config = parse("products: [{name: a, portion: 1/64}, {name: b, portion: 1/32}]\n")
    assert config.slots == 64
    assert [p.portion for p in config.defaults.products] == [Fraction(1, 64), Fraction(1, 32)]


@pytest.mark.parametrize(
    ("body", "modes"),
    [
        ("", ("time-slicing", "sm-sharing")),
        ("defaults: {computeMode: auto}\n", ("time-slicing", "sm-sharing")),
        ("defaults: {computeMode: time-slicing}\n", ("time-slicing",)),
        ("defaults: {computeMode: sm-sharing}\n", ("sm-sharing",)),
    ],
)
def test_compute_mode_auto_by_default_or_pinned(body: str, modes: tuple[str, ...]) -> None:
    config = parse(body)
    assert [config.for_gpu(g).modes for g in gpus()] == [modes] * 4


def test_a_pinned_gpu_among_auto_ones_and_auto_over_a_pinned_default() -> None:
    g = gpus()
    pinned = parse("gpus: [{selector: {index: 1}, computeMode: sm-sharing}]\n")
    assert [pinned.for_gpu(x).modes for x in g] == [
        ("time-slicing", "sm-sharing"),
        ("sm-sharing",),
        ("time-slicing", "sm-sharing"),
        ("time-slicing", "sm-sharing"),
    ]
    released = parse(
        """
        defaults: {computeMode: time-slicing}
        gpus: [{selector: {product: NVIDIA H200}, computeMode: auto}]
        """
    )
    assert [released.for_gpu(x).compute_mode for x in g] == [
        "auto",
        "auto",
        "time-slicing",
        "time-slicing",
    ]


def test_extended_resources_opt_in() -> None:
    assert parse("extendedResources: true\n").extended_resources is True
    assert parse("extendedResources: false\n") == NodeConfig()


def test_gpu_config_defaults_match_node_defaults() -> None:
    assert NodeConfig().defaults == GpuConfig()


# --- quantities --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("256Mi", 256 * 2**20),
        ("1.5Gi", 3 * 2**29),
        ("1G", 10**9),
        ("500m", Fraction(1, 2)),
        ("1e3", 1000),
        ("2E", 2 * 10**18),
        ("143771Mi", 143771 * 2**20),
        ("12", 12),
        (".5Ki", 512),
    ],
)
def test_quantity_value(text: str, value: Fraction | int) -> None:
    assert quantity_value(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1GB", "1 Gi", "0x10", "1Gi2"])
def test_quantity_value_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        quantity_value(text)


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [
        (0, True, "0"),
        (5, True, "5"),
        (1000, True, "1k"),
        (1024, True, "1Ki"),
        (1500, True, "1500"),
        (15000, True, "15k"),
        (150754820096, True, "143771Mi"),
        (2**30, True, "1Gi"),
        (2**30, False, "1073741824"),
        (8, False, "8"),
        (1_000_000, False, "1M"),
        (10**18, False, "1E"),
        (10**21, False, "1000E"),
    ],
)
def test_canonical_quantity(value: int, binary: bool, text: str) -> None:
    assert canonical_quantity(value, binary=binary) == text


@given(st.integers(min_value=0, max_value=2**62), st.booleans())
def test_canonical_quantity_round_trips_and_is_stable(value: int, binary: bool) -> None:
    text = canonical_quantity(value, binary=binary)
    assert quantity_value(text) == value
    # the server re-canonicalises with the format the suffix implies: must be a fixpoint
    is_binary = text[-2:] in {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
    assert canonical_quantity(value, binary=is_binary) == text


def test_canonical_quantity_rejects_negative() -> None:
    with pytest.raises(ValueError):
        canonical_quantity(-1)


@pytest.mark.parametrize(("value", "expected"), [(1024, 1024), ("1Gi", 2**30), ("2048Ki", 2 * MIB)])
def test_parse_bytes(value: int | str, expected: int) -> None:
    assert parse_bytes(value, "x") == expected


@pytest.mark.parametrize("value", [-1, "-1Gi", "0.5", True, None, 1.5, "10m"])
def test_parse_bytes_rejects(value: object) -> None:
    with pytest.raises(ConfigError, match="^f: "):
        parse_bytes(value, "f")


# --- null values, duplicate keys, unreadable files (tester's findings) -----------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # A null selector field used to mean "absent", so the override matched every GPU.
        (
            "gpus: [{selector: {index: null}, enabled: false}]\n",
            "gpus[0].selector.index: must be a non-negative integer, got None",
        ),
        (
            "gpus: [{selector: {index: ~, product: NVIDIA H200}, enabled: false}]\n",
            "gpus[0].selector.index: must be a non-negative integer, got None",
        ),
        (
            "gpus:\n  - selector:\n      index:\n    enabled: false\n",
            "gpus[0].selector.index: must be a non-negative integer, got None",
        ),
        ("gpus: [{selector: {uuid: null}, enabled: false}]\n", "gpus[0].selector.uuid: must be"),
        ("gpus: [{selector: {product: ~}, enabled: false}]\n", "gpus[0].selector.product: must"),
        # enabled: null used to mean "unchanged" (and passed the "sets something" check).
        ("gpus: [{selector: {index: 0}, enabled: null}]\n", "gpus[0].enabled: must be true or"),
        # A null section is not an empty one.
        ("defaults: null\n", "defaults: must be a mapping, got null"),
        ("capacity:\n", "capacity: must be a mapping, got null"),
        ("gpus: [~]\n", "gpus[0]: must be a mapping, got null"),
        ("gpus: [{selector: ~, enabled: false}]\n", "gpus[0].selector: must be a mapping, got"),
        (
            "gpus: [{selector: {index: 0}, capacity: ~}]\n",
            "gpus[0].capacity: must be a mapping, got null",
        ),
        ("products: [~]\n", "products[0]: must be a mapping, got null"),
        ("defaults: {computeMode: null}\n", "defaults.computeMode: must be one of"),
        ("defaults: {fractionModel: ~}\n", "defaults.fractionModel: must be one of"),
        ("capacity: {default: null}\n", "capacity.default: must be a quantity"),
        ("capacity: {step: ~}\n", "capacity.step: must be a quantity"),
        ("products: [{name: a, portion: null}]\n", "products[0].portion: must be a fraction"),
        ("products: [{name: null, portion: 1}]\n", "products[0].name: None must be a DNS label"),
        (
            "gpus: [{selector: {index: 0}, products: null}]\n",
            "gpus[0].products: must be a non-empty list",
        ),
        (
            "gpus: [{selector: {index: 0}, computeMode: null}]\n",
            "gpus[0].computeMode: must be one of",
        ),
        ("gpus: null\n", "gpus: must be a list, got NoneType"),
    ],
)
def test_null_is_never_absent(body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_node_config_text(HEAD + body, source="node.yaml")
    assert str(err.value).startswith("node.yaml: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "gpus:\n  - {selector: {index: 0}, enabled: false}\n"
            "defaults: {computeMode: sm-sharing}\n"
            "gpus:\n  - {selector: {index: 1}, enabled: false}\n",
            "node.yaml: line 6: duplicate key 'gpus' (first at line 3)",
        ),
        (
            "gpus: [{selector: {index: 0, index: 1}, enabled: false}]\n",
            "node.yaml: line 3: duplicate key 'index' (first at line 3)",
        ),
        (
            "defaults:\n  computeMode: sm-sharing\n  computeMode: time-slicing\n",
            "node.yaml: line 5: duplicate key 'computeMode' (first at line 4)",
        ),
        (
            "products:\n  - name: a\n    portion: 1/4\n    portion: 1/2\n",
            "node.yaml: line 6: duplicate key 'portion' (first at line 5)",
        ),
    ],
)
def test_duplicate_keys_are_rejected(body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_node_config_text(HEAD + body, source="node.yaml")
    assert str(err.value) == message


def test_merge_keys_may_be_overridden() -> None:
    """``<<: *anchor`` followed by an explicit key is an override, not a duplicate."""
    config = parse(
        """
        gpus:
          - &h200 {selector: {product: NVIDIA H200}, computeMode: sm-sharing}
          - <<: *h200
            selector: {index: 2}
        """
    )
    assert config.gpus[1].selector == GpuSelector(index=2)
    assert config.gpus[1].compute_mode == "sm-sharing"


def test_non_utf8_file_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_bytes(HEAD.encode() + b"# caf\xe9\n")
    with pytest.raises(ConfigError) as err:
        load_node_config(str(path))
    assert str(err.value).startswith(f"{path}: ")
    assert "not UTF-8" in str(err.value) and "line 3" in str(err.value)


def test_unreadable_path_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{tmp_path}: cannot read node configuration: "):
        load_node_config(str(tmp_path))  # a directory


def test_os_error_without_strerror_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(HEAD)

    def fail(*_args: object, **_kwargs: object) -> bytes:
        raise OSError("device went away")

    monkeypatch.setattr(Path, "read_bytes", fail)
    with pytest.raises(ConfigError) as err:
        load_node_config(str(path))
    assert str(err.value) == f"{path}: cannot read node configuration: device went away"


# --- selectors that match no GPU ----------------------------------------------------------


def test_unmatched_selectors_are_reported() -> None:
    g = gpus()
    config = parse(
        f"""
        gpus:
          - selector: {{index: 1}}
            computeMode: sm-sharing
          - selector: {{uuid: GPU-does-not-exist}}
            enabled: false
          - selector: {{product: H200}}
            enabled: false
          - selector: {{index: 0, uuid: {g[1].uuid}}}
            enabled: false
          - selector: {{uuid: {g[3].uuid}}}
            enabled: false
        """
    )
    assert config.unmatched_selectors(g) == (
        "gpus[1].selector {uuid: GPU-does-not-exist} matches no GPU on this node",
        "gpus[2].selector {product: H200} matches no GPU on this node",
        f"gpus[3].selector {{index: 0, uuid: {g[1].uuid}}} matches no GPU on this node",
    )
    assert parse("").unmatched_selectors(g) == ()
    assert config.unmatched_selectors([]) == tuple(
        f"gpus[{i}].selector {s} matches no GPU on this node"
        for i, s in enumerate(
            [
                "{index: 1}",
                "{uuid: GPU-does-not-exist}",
                "{product: H200}",
                f"{{index: 0, uuid: {g[1].uuid}}}",
                f"{{uuid: {g[3].uuid}}}",
            ]
        )
    )


def test_warn_unmatched_selectors_logs_a_warning_each() -> None:
    config = parse(
        """
        gpus:
          - selector: {index: 7}
            enabled: false
          - selector: {index: 0}
            enabled: false
        """
    )
    with structlog.testing.capture_logs() as logs:
        found = warn_unmatched_selectors(config, gpus(), source="node.yaml")
    assert found == ("gpus[0].selector {index: 7} matches no GPU on this node",)
    assert logs == [
        {
            "event": "node configuration entry matches no GPU; it has no effect",
            "log_level": "warning",
            "node_config": "node.yaml",
            "entry": "gpus[0]",
            "detail": found[0],
        }
    ]


def test_example_selectors_all_match_the_documented_node() -> None:
    """Every gpus[] entry of the example applies on the node its comments name
    (render-slices --node node-a --gpus simulated:H200x8)."""
    config = load_node_config(str(EXAMPLE))
    node = gpus("simulated:H200x8")
    assert config.unmatched_selectors(node) == ()
    assert config.for_gpu(node[7]).fraction_model == "capacity"
    assert config.for_gpu(node[7]).capacity.minimum == 2 * GIB
    assert not config.for_gpu(node[6]).enabled
