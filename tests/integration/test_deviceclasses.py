"""The chart's DeviceClasses (rendered by devtools/chartrender.py, their one source): valid,
named as the slices' side names them, and each selects exactly the published devices it is
named for; hack/render-deviceclasses writes and checks a directory of them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import chartrender
from devtools.chartrender import POLICY_FILE, device_classes, main, sizing_policies
from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.classnames import device_class_name
from dra_driver.config.load import parse_node_config
from dra_driver.gpus import SimulatedGpuSource
from dra_driver.publish.slices import build_slices, slice_devices
from tests.support import k8sschema
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

ROOT = REPO
SHIPPED = ROOT / "manifests" / "deviceclasses"
EXAMPLE = ROOT / "docs" / "examples" / "node-config.example.yaml"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
TERM = re.compile(
    r'^device\.(?:driver|attributes\["([^"]+)"\]\.([A-Za-z_][A-Za-z0-9_]*)) == "([^"]*)"$'
)


class CelError(Exception):
    """A CEL runtime error (e.g. no such key)."""


def _term(term: str, device: Mapping[str, Any], driver: str) -> bool | CelError:
    """One term: ``x == "literal"``, or ``(t1 || t2 ...)`` (true if any is true, even when
    another errs; else an error if any errs; else false: CEL's ``||``)."""
    if term.startswith("(") and term.endswith(")"):
        results = [_term(t, device, driver) for t in term[1:-1].split(" || ")]
        if True in results:
            return True
        errors = [r for r in results if isinstance(r, CelError)]
        return errors[0] if errors else False
    m = TERM.match(term)
    assert m, f"unexpected selector term {term!r}"
    domain, attr, literal = m.groups()
    if domain is None:
        return driver == literal
    attrs = {
        (k if "/" in k else f"{driver}/{k}"): v for k, v in device.get("attributes", {}).items()
    }
    value = attrs.get(f"{domain}/{attr}")
    if value is None:
        return CelError(f"no such key: {attr}")
    return bool(value.get("string") == literal)


def evaluate(expression: str, device: Mapping[str, Any], driver: str) -> bool:
    """Evaluate the generated selector form ``t1 && t2 ...`` (see :func:`_term`) with CEL
    semantics: unqualified attributes live in the driver's domain; a missing attribute is an
    error, and ``&&`` is false if any term is false, else an error if any term errs."""
    results = [_term(term, device, driver) for term in expression.split(" && ")]
    if False in results:
        return False
    errors = [r for r in results if isinstance(r, CelError)]
    if errors:
        raise errors[0]
    return True


def example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


def test_default_class_names() -> None:
    names = [c["metadata"]["name"] for c in device_classes()]
    assert names == [
        "gpu-eighth",
        "gpu-eighth-sm-sharing",
        "gpu-quarter",
        "gpu-quarter-sm-sharing",
        "gpu-half",
        "gpu-half-sm-sharing",
        "gpu-full",
        "gpu-full-sm-sharing",
        "gpu-memory",
        "gpu-memory-sm-sharing",
    ]


def test_classes_and_policies_are_valid() -> None:
    objects = chartrender.render(chartrender.chart_values(example()))
    objects += chartrender.render(chartrender.chart_values(driver="gpu.example.com"))
    for obj in objects:
        k8sschema.validate(obj)
    for c in (o for o in objects if o["kind"] == "DeviceClass"):
        name = c["metadata"]["name"]
        assert DNS_LABEL.match(name) and len(name) <= 63
    assert [d["kind"] for d in sizing_policies()] == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    longest = device_class_name("x" * 40, "sm-sharing")
    assert len(longest) <= 63


def _selects(product_attribute: str | None, class_product: str | None) -> bool:
    """Whether a class for ``class_product`` (None: capacity) may take a device whose
    ``product`` attribute is ``product_attribute``: a GPU's shared products device (``*``)
    serves every product class, an extended-resource device only its product's."""
    if class_product is None:
        return product_attribute is None
    return product_attribute in ("*", class_product)


@pytest.mark.parametrize("extended", [False, True], ids=["shared", "extended-resources"])
def test_each_class_selects_exactly_its_devices(extended: bool) -> None:
    driver = DEFAULT_DRIVER_NAME
    doc = {
        "apiVersion": "gpu-fraction.dra.dev/v1alpha1",
        "kind": "NodeConfig",
        "gpus": [
            {"selector": {"index": 1}, "computeMode": "sm-sharing"},
            {"selector": {"index": 2}, "fractionModel": "capacity"},
            {"selector": {"index": 3}, "fractionModel": "capacity", "computeMode": "sm-sharing"},
        ],
        "extendedResources": extended,
    }
    config = parse_node_config(doc)
    inv = SimulatedGpuSource("simulated:H200x2,L4x2", seed="n").discover()
    devices = slice_devices(build_slices(inv, config, driver, "n"))
    # plus a device of another driver that happens to have similar attributes
    foreign = {"name": "x", "attributes": {"product": {"string": "quarter"}}}
    classes = device_classes(config=doc, driver=driver)
    for c in classes:
        expression = c["spec"]["selectors"][0]["cel"]["expression"]
        labels = c["metadata"]["labels"]
        selected = {d["name"] for d in devices if evaluate(expression, d, driver)}
        expected = {
            d["name"]
            for d in devices
            if d["attributes"]["fractionModel"]["string"] == labels[f"{driver}/fraction-model"]
            and d["attributes"]["computeMode"]["string"] == labels[f"{driver}/compute-mode"]
            and _selects(
                d["attributes"].get("product", {}).get("string"),
                labels.get(f"{driver}/product"),
            )
        }
        assert selected == expected, c["metadata"]["name"]
        assert not evaluate(expression, foreign, "other.example.com")
    by_class = {
        c["metadata"]["name"]: sorted(
            d["name"]
            for d in devices
            if evaluate(c["spec"]["selectors"][0]["cel"]["expression"], d, driver)
        )
        for c in classes
    }
    # GPU 0: auto (both modes), GPU 1: sm-sharing, GPU 2: capacity auto, GPU 3: capacity sm.
    assert by_class["gpu-quarter"] == sorted(
        ["gpu-0-time-slicing"] + ["gpu-0-time-slicing-quarter"] * extended
    )
    assert by_class["gpu-quarter-sm-sharing"] == sorted(
        ["gpu-0-sm-sharing", "gpu-1-sm-sharing"]
        + ["gpu-0-sm-sharing-quarter", "gpu-1-sm-sharing-quarter"] * extended
    )
    assert by_class["gpu-memory"] == ["gpu-2-time-slicing"]
    assert by_class["gpu-memory-sm-sharing"] == ["gpu-2-sm-sharing", "gpu-3-sm-sharing"]


def test_custom_products_and_modes() -> None:
    classes = device_classes(
        config=example(), compute_modes=["sm-sharing"], fraction_models=["products"]
    )
    assert [c["metadata"]["name"] for c in classes] == [
        "gpu-eighth-sm-sharing",
        "gpu-quarter-sm-sharing",
        "gpu-half-sm-sharing",
        "gpu-full-sm-sharing",
        "gpu-sixteenth-sm-sharing",
    ]
    with pytest.raises(chartrender.RenderError, match="computeModes"):
        device_classes(compute_modes=["exclusive"])


def test_main_write_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--write", str(tmp_path), "--config", str(EXAMPLE)]) == 0
    assert (tmp_path / "gpu-sixteenth.yaml").exists()
    written = list(yaml.safe_load_all((tmp_path / POLICY_FILE).read_text()))
    assert written == sizing_policies(config=example())
    assert "gpu-sixteenth" in written[0]["spec"]["variables"][0]["expression"]
    assert main(["--check", str(tmp_path), "--config", str(EXAMPLE)]) == 0
    (tmp_path / "gpu-half.yaml").write_text("changed\n")
    (tmp_path / "gpu-extra.yaml").write_text("x\n")
    (tmp_path / POLICY_FILE).unlink()
    assert main(["--check", str(tmp_path), "--config", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert "gpu-half.yaml" in err and "gpu-extra.yaml" in err and POLICY_FILE in err
    (tmp_path / "mine.yaml").write_text("# an admin's own file\n")
    assert main(["--write", str(tmp_path)]) == 0
    assert not (tmp_path / "gpu-sixteenth.yaml").exists(), "a class that went is removed"
    assert (tmp_path / "mine.yaml").exists(), "a file it did not write is kept"
    assert main([]) == 0
    stream = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"]["name"]) for d in stream] == [
        (d["kind"], d["metadata"]["name"]) for d in chartrender.render(chartrender.chart_values())
    ]
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
