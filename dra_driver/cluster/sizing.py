"""The sizing admission policies: the DeviceClass alone chooses a product's size, and a claim of
a product class ends up with exactly that size or is refused.

A products-model device of a GPU (:mod:`dra_driver.publish.slices`) is shared and has a consumable
capacity ``slots`` (``slotsPerGpu``, 8 by default); a claim's product is how many slots it
consumes. DeviceClasses cannot carry a capacity request, so a MutatingAdmissionPolicy
(``admissionregistration.k8s.io/v1``, GA and on by default since Kubernetes 1.36) writes it
into each request of a new ResourceClaim whose class is a product class:

- ``exactly.capacity.requests.slots`` = the product's ``portion * slotsPerGpu`` (replacing
  whatever the user wrote, other capacities included), and
- with extended resources on, a selector keeping the request on the GPU's shared device
  (``product == "*"``), off the extended-resource devices, which are reserved for claims that
  take a device's default (without them the selector would only cost the scheduler time).

Requests in ``firstAvailable`` lists are sized the same way. Claims the scheduler creates for
extended resources are exempt by **who creates them** (the request's user,
:data:`SCHEDULER_USER`), never by anything a tenant can write (the scheduler's annotation
``resource.kubernetes.io/extended-resource-claim`` can be set by anyone): they are allocated
before they are created, at each device's default (:func:`dra_driver.publish.offer.offer`).

A ValidatingAdmissionPolicy of the same name guards the result, whatever the path:

- a new claim of a product class from anyone but the scheduler must consume exactly the
  product's slots and nothing else (the mutation above makes it so; this catches a claim the
  mutation missed);
- the scheduler may create claims of this driver's classes only for classes that carry an
  ``extendedResourceName`` (product classes with extended resources on): Kubernetes gives
  every DeviceClass an implicit extended resource ``deviceclass.resource.kubernetes.io/<class>``,
  which would otherwise give a pod a device's default share without a size;
- when an allocation is written (``status`` update), each result of a product-class request
  must consume exactly the product's slots (admin-access results aside).

The policies run in the API server: no controller sits in the scheduling path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.classnames import device_class_name, label_value
from dra_driver.config.node import NodeConfig, default_node_config
from dra_driver.model.vocabulary import ANY_PRODUCT, COMPUTE_MODES

SCHEDULER_USER = "system:kube-scheduler"
"""The user kube-scheduler authenticates as (its certificate's CN, or the identity of its
kubeconfig): the only one whose claims the sizing policies exempt, because it creates the
claims of extended-resource requests already allocated (chart value
``policies.schedulerUser``)."""


def policy_name(driver: str) -> str:
    """Name of the policy and its binding: ``<driver, dots as dashes>-product-sizes``."""
    return f"{driver.replace('.', '-')}-product-sizes"


def _cel_list(names: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


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
    scheduler: str = SCHEDULER_USER,
) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy, the ValidatingAdmissionPolicy that guards it (see the
    module) and their bindings (API JSON) for ``config``'s products, in that order.

    Args:
        config: the node configuration whose products get sizes (default: the default one).
        driver: the driver name.
        compute_modes: the modes that get classes.
        scheduler: the username of kube-scheduler, exempt from the mutation.
    """
    config = config if config is not None else default_node_config()
    sizes = class_slots(config, compute_modes)
    table = "{" + ", ".join(f'"{name}": {n}' for name, n in sorted(sizes.items())) + "}"
    name = policy_name(driver)
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
                {
                    "name": "not-the-scheduler",
                    "expression": f'request.userInfo.username != "{scheduler}"',
                }
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
    extended = sorted(sizes) if config.extended_resources else []
    ours = [*sorted(sizes), *(device_class_name(None, m) for m in compute_modes)]
    guard = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["resourceclaims", "resourceclaims/status"],
                    }
                ],
            },
            "matchConditions": [{"name": "created-or-newly-allocated", "expression": GUARD_MATCH}],
            "variables": [
                {"name": "slots", "expression": table},
                {"name": "extended", "expression": _cel_list(extended)},
                {"name": "ours", "expression": _cel_list(ours)},
                {
                    "name": "fromScheduler",
                    "expression": f'request.userInfo.username == "{scheduler}"',
                },
                *GUARD_VARIABLES,
                {"name": "missized", "expression": guard_missized(driver)},
            ],
            "validations": guard_validations(driver),
        },
    }
    guard_binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding, guard, guard_binding]


GUARD_MATCH = (
    'request.operation == "CREATE" || (request.subResource == "status" '
    "&& has(object.status) && has(object.status.allocation) "
    "&& !(has(oldObject.status) && has(oldObject.status.allocation)))"
)
"""The guard looks at new claims and at the status write that first allocates a claim (the
plugin's own status writes resend an allocation and are left alone)."""


def _sized(x: str) -> str:
    """CEL: request ``x`` of a product class asks exactly its product's slots, nothing else."""
    return (
        f"{x}.?capacity.?requests.orValue({{}}).size() == 1 "
        f'&& isQuantity(string({x}.?capacity.?requests[?"slots"].orValue(""))) '
        f'&& quantity(string({x}.?capacity.?requests[?"slots"].orValue("0")))'
        f".compareTo(quantity(string(variables.slots[{x}.deviceClassName]))) == 0"
    )


GUARD_VARIABLES: tuple[dict[str, str], ...] = (
    {"name": "requests", "expression": "object.spec.?devices.?requests.orValue([])"},
    {
        # every request and subrequest: [name, class]
        "name": "pairs",
        "expression": (
            "variables.requests.map(r, has(r.exactly) "
            "? [[string(r.name), string(r.exactly.deviceClassName)]] "
            ": r.?firstAvailable.orValue([]).map(s, "
            '[string(r.name) + "/" + string(s.name), string(s.deviceClassName)])).flatten()'
        ),
    },
    {
        # product-class requests that do not ask exactly their product's slots
        "name": "unsized",
        "expression": (
            "variables.requests.map(r, has(r.exactly) "
            f"? (r.exactly.deviceClassName in variables.slots && !({_sized('r.exactly')}) "
            '? [string(r.name) + " (" + string(r.exactly.deviceClassName) + ")"] : []) '
            ": r.?firstAvailable.orValue([])"
            f".filter(s, s.deviceClassName in variables.slots && !({_sized('s')}))"
            '.map(s, string(r.name) + "/" + string(s.name) + " (" + string(s.deviceClassName) '
            '+ ")")).flatten()'
        ),
    },
    {
        # requests of this driver's classes that carry no extended resource name
        "name": "notExtended",
        "expression": (
            "variables.pairs.filter(p, p[1] in variables.ours && !(p[1] in variables.extended))"
            '.map(p, p[0] + " (" + p[1] + ")")'
        ),
    },
)


def guard_missized(driver: str) -> str:
    """CEL: the results of ``driver`` in a new allocation whose product-class request does not
    consume exactly its product's slots, as ``"<request> got <n> slots of device <device>"``."""
    consumed = 'x.?consumedCapacity[?"slots"]'
    return (
        "object.status.allocation.?devices.?results.orValue([]).filter(x, "
        f'x.driver == "{driver}" && !x.?adminAccess.orValue(false) '
        "&& variables.pairs.exists(p, p[0] == x.request && p[1] in variables.slots "
        f'&& !(isQuantity(string({consumed}.orValue(""))) '
        f'&& quantity(string({consumed}.orValue("0")))'
        ".compareTo(quantity(string(variables.slots[p[1]]))) == 0)))"
        f'.map(x, x.request + " got " + string({consumed}.orValue("no")) + " slots of device " '
        "+ x.device)"
    )


def guard_validations(driver: str) -> list[dict[str, str]]:
    """The guard's three rules (see the module), each with a message that says what to do."""
    return [
        {
            "expression": (
                'request.operation != "CREATE" || variables.fromScheduler '
                "|| variables.unsized.size() == 0"
            ),
            "reason": "Invalid",
            "messageExpression": (
                "\"a request of a product class must consume exactly its product's slots, "
                'which the sizing policy writes: " + variables.unsized.join(", ") '
                '+ " do not; is the MutatingAdmissionPolicy of the same name installed and '
                'bound?"'
            ),
        },
        {
            "expression": (
                'request.operation != "CREATE" || !variables.fromScheduler '
                "|| variables.notExtended.size() == 0"
            ),
            "reason": "Forbidden",
            "messageExpression": (
                'variables.notExtended.join(", ") + ": extended resources are not enabled for '
                f"the DeviceClasses of {driver} (Helm value extendedResources.enabled); ask for "
                'a fraction with a ResourceClaimTemplate instead"'
            ),
        },
        {
            "expression": 'request.operation != "UPDATE" || variables.missized.size() == 0',
            "reason": "Forbidden",
            "messageExpression": (
                '"allocation refused: a request of a product class gets exactly its '
                'product\'s slots; " + variables.missized.join(", ")'
            ),
        },
    ]
