"""A driver reloaded under prepared claims (kubernetes-sigs/dra-driver-nvidia-gpu#1144's
variant): the GPUs keep their UUIDs but get other device minors. The plugin restarts; at its
start every prepared claim's CDI spec and record name the GPU's new ``/dev/nvidia<minor>``,
since a spec naming the old node would give a restarted container another GPU or none."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from dra_driver.model.plans import ClaimRef
from tests.support import claimfactory as cf
from tests.support.node import NODE, Node

OFFSET = 16


def _nodes(spec: dict[str, Any]) -> set[str]:
    return {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}


def _reload(node: Node) -> None:
    """The driver renumbers its GPUs: same UUIDs, minors + :data:`OFFSET`."""
    node.devices = {
        name: replace(d, gpu=replace(d.gpu, minor=d.gpu.minor + OFFSET))
        for name, d in node.devices.items()
    }
    node.make_device_nodes()


def test_a_restart_after_a_reload_rewrites_specs_and_records_for_the_new_minors(
    node: Node,
) -> None:
    claims = [cf.on_node(cf.claim([node.share(gpu, "eighth")]), NODE) for gpu in (0, 1)]
    refs = []
    for claim in claims:
        node.claims.add(claim)
        m = claim["metadata"]
        refs.append(ClaimRef(m["namespace"], m["name"], m["uid"]))
    first = node.preparation()
    answers = first.prepare(refs)
    assert all(a.error == "" for a in answers.values())
    before = {r.uid: json.loads(first.cdi.path(r.uid).read_text()) for r in refs}
    assert [sorted(n for n in _nodes(s) if n[-1].isdigit()) for s in before.values()] == [
        ["/dev/nvidia0"],
        ["/dev/nvidia1"],
    ]
    first.close()

    _reload(node)
    second = node.preparation()
    for i, r in enumerate(refs):
        spec = json.loads(second.cdi.path(r.uid).read_text())
        gpu_nodes = {n for n in _nodes(spec) if n.removeprefix("/dev/nvidia").isdigit()}
        assert gpu_nodes == {f"/dev/nvidia{i + OFFSET}"}
        # the same CDI device names: containers that start again find them in the new spec
        assert [d["name"] for d in spec["devices"]] == [d["name"] for d in before[r.uid]["devices"]]
        [device] = second.checkpoint.claims[r.uid].plan.devices
        assert device.gpu.minor == i + OFFSET
    # the kubelet's repeated Prepare is answered from the rewritten record
    again = second.prepare(refs)
    assert {u: a.devices for u, a in again.items()} == {u: a.devices for u, a in answers.items()}
    second.close()

    third = node.preparation()  # rewritten once: a later start finds nothing to change
    assert {r.uid: third.checkpoint.claims[r.uid] for r in refs} == {
        r.uid: second.checkpoint.claims[r.uid] for r in refs
    }
    assert not [c for c in node.enforcer.calls if c[0] == "release"]  # no claim torn down
    third.close()
