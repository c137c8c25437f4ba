"""The sizing admission policy: the DeviceClass alone chooses a product's size.

A products-model device of a GPU (:mod:`dra_driver.slices`) is shared and has a consumable
capacity ``slots`` (``slotsPerGpu``, 8 by default); a claim's product is how many slots it
consumes. DeviceClasses cannot carry a capacity request, so a MutatingAdmissionPolicy
(``admissionregistration.k8s.io/v1``, GA and on by default since Kubernetes 1.36) writes it
into each request of a new ResourceClaim whose class is a product class:

- ``exactly.capacity.requests.slots`` = the product's ``portion * slotsPerGpu`` (replacing
  whatever the user wrote), and
- with extended resources on, a selector keeping the request on the GPU's shared device
  (``product == "*"``), off the extended-resource devices, which are reserved for claims that
  take a device's default (without them the selector would only cost the scheduler time).

Claims the scheduler creates for extended resources (annotation
``resource.kubernetes.io/extended-resource-claim``) are left alone: they are allocated before
they are created, at each device's default (:func:`dra_driver.offer.offer`). Requests in
``firstAvailable`` lists are sized the same way. Nothing else is changed. The policy runs in
the API server: no controller sits in the scheduling path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.classnames import device_class_name, label_value
from dra_driver.config import NodeConfig, default_node_config
from dra_driver.vocabulary import ANY_PRODUCT, COMPUTE_MODES

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""Set by kube-scheduler on the claims it creates for extended resources (k8s.io/api
``resource/v1``, ``ExtendedResourceClaimAnnotation``)."""


def policy_name(driver: str) -> str:
    """Name of the policy and its binding: ``<driver, dots as dashes>-product-sizes``."""
    return f"{driver.replace('.', '-')}-product-sizes"


def class_slots(config: NodeConfig, compute_modes: Sequence[str] = COMPUTE_MODES) -> dict[str, int]:
    """Product class name -> slots its claims consume (``portion * slotsPerGpu``)."""
    slots = config.slots
    return {
        device_class_name(p.name, mode): int(p.portion * slots)
        for p in config.all_products()
        for mode in compute_modes
    }


def _patches(driver: str, base: str, request: str, select: bool) -> str:
    """CEL list of the JSON patches for the request at JSON pointer ``base`` (a CEL string
    expression) whose fields are the CEL value ``request``: its capacity request and, with
    ``select`` (extended-resource devices exist), the selector of the shared device."""
    amount = f"string(variables.slots[{request}.deviceClassName])"
    shared = f'device.attributes["{driver}"].product == "{ANY_PRODUCT}"'
    selector = f'{{"cel": {{"expression": {_cel_string(shared)}}}}}'
    capacity = (
        f'JSONPatch{{op: "add", path: {base} + "/capacity", '
        f'value: {{"requests": {{"slots": {amount}}}}}}}'
    )
    if not select:
        return f"[{capacity}]"
    return (
        f"[{capacity}, has({request}.selectors) ? "
        f'JSONPatch{{op: "add", path: {base} + "/selectors/-", value: {selector}}} : '
        f'JSONPatch{{op: "add", path: {base} + "/selectors", value: [{selector}]}}]'
    )


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def patch_expression(driver: str, select: bool = False) -> str:
    """The policy's JSONPatch expression (CEL): patches for every product-class request
    (``select``: also the shared-device selector, needed with extended resources on)."""
    exact = _patches(
        driver, '"/spec/devices/requests/" + string(i) + "/exactly"', "r.exactly", select
    )
    sub = _patches(
        driver,
        '"/spec/devices/requests/" + string(i) + "/firstAvailable/" + string(j)',
        "s",
        select,
    )
    return (
        "!has(object.spec.devices) || !has(object.spec.devices.requests) ? [] : "
        "object.spec.devices.requests.transformList(i, r, "
        "has(r.exactly) && r.exactly.deviceClassName in variables.slots, "
        f"{exact}).flatten() + "
        "object.spec.devices.requests.transformList(i, r, has(r.firstAvailable), "
        "r.firstAvailable.transformList(j, s, s.deviceClassName in variables.slots, "
        f"{sub}).flatten()).flatten()"
    )


def sizing_policy(
    config: NodeConfig | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    compute_modes: Sequence[str] = COMPUTE_MODES,
) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and its binding (API JSON) for ``config``'s products."""
    config = config if config is not None else default_node_config()
    sizes = class_slots(config, compute_modes)
    table = "{" + ", ".join(f'"{name}": {n}' for name, n in sorted(sizes.items())) + "}"
    name = policy_name(driver)
    no_annotation = (
        "!has(object.metadata.annotations) || "
        f'!("{EXTENDED_RESOURCE_CLAIM_ANNOTATION}" in object.metadata.annotations)'
    )
    labels = {"app.kubernetes.io/part-of": label_value(driver)}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["resourceclaims"],
                    }
                ],
            },
            "matchConditions": [
                {"name": "not-an-extended-resource-claim", "expression": no_annotation}
            ],
            "variables": [{"name": "slots", "expression": table}],
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {
                        "expression": patch_expression(driver, config.extended_resources)
                    },
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"policyName": name},
    }
    return [policy, binding]
