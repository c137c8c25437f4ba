"""A plugin killed at any step of Prepare or Unprepare leaves each claim all there or all gone.

The kill is simulated in-process: an effect (enforcer apply/release, CDI write/remove,
checkpoint save) raises :class:`Killed` (a ``BaseException``, which the driver does not catch
as a claim error) before or after it runs; the "restarted" plugin is a new
``ClaimPreparation`` with a new enforcer (a new process has no MPS bookkeeping).
``tests/integration/test_crash_kill.py`` does the same with real SIGKILLs of the real plugin
process.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from dra_driver.enforce import MpsOptions, RecordingEnforcer
from dra_driver.enforce.rules.names import namespace_name
from dra_driver.model.plans import ClaimRef
from dra_driver.prepare.preparation import ClaimPreparation
from tests.support import claimfactory as cf
from tests.support.crashcheck import ABSENT, PREPARED, claim_state, pipe_dirs, spec_path
from tests.support.fakes import plans
from tests.support.node import Node


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs (but ``finally`` blocks do)."""


def ref(claim: dict[str, Any]) -> ClaimRef:
    m = claim["metadata"]
    return ClaimRef(m["namespace"], m["name"], m["uid"])


def uid(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


@pytest.fixture
def sim(node: Node) -> Iterator[Node]:
    """``node`` with an enforcer that creates pipe directories, as the simulated plugin's."""
    node.enforcer = new_enforcer(node)
    yield node


def new_enforcer(node: Node) -> RecordingEnforcer:
    return RecordingEnforcer(make_dirs=True, options=MpsOptions(root=str(node.root / "run")))


def restart(node: Node, old: ClaimPreparation) -> ClaimPreparation:
    old.close()
    node.enforcer = new_enforcer(node)
    return node.preparation()


def state(node: Node, claim: dict[str, Any]) -> str:
    return claim_state(node.state_dir, node.cdi_root, node.root / "run", uid(claim))


def claims(node: Node) -> list[dict[str, Any]]:
    """A single-GPU claim and a claim with a device on each GPU (its own MPS server)."""
    made = [
        cf.claim([node.share(0, "quarter")]),
        cf.claim(
            [
                node.share(0, "eighth"),
                node.share(1, "eighth"),
            ]
        ),
    ]
    for c in made:
        node.claims.add(c)
    return made


WHEN = ("before", "after")
PREPARE_STEPS = [("apply", 1), ("apply", 2), ("write", 1), ("write", 2), ("save", 1)]
"""The effects of preparing two claims in one call, with their call count."""
UNPREPARE_STEPS = [
    ("release", 1),
    ("release", 2),
    ("remove", 1),
    ("remove", 2),
    ("save", 1),
]
"""The effects of unpreparing two claims in one call, with their call count."""


def killing(effect: str, when: str, nth: int) -> Callable[[Callable[..., Any]], Any]:
    """Wrap ``effect`` so that its ``nth`` call raises :class:`Killed` ``when``."""

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        calls = 0

        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == nth and when == "before":
                raise Killed(effect)
            out = real(*args, **kwargs)
            if calls == nth:
                raise Killed(effect)
            return out

        return call

    return wrap


def patched(node: Node, preparation: ClaimPreparation, effect: str, when: str, nth: int) -> Any:
    owner: object = {
        "apply": node.enforcer,
        "release": node.enforcer,
        "write": preparation.cdi,
        "remove": preparation.cdi,
        "save": preparation.checkpoint,
    }[effect]
    return mock.patch.object(owner, effect, killing(effect, when, nth)(getattr(owner, effect)))


def check_recovers(
    node: Node, preparation: ClaimPreparation, made: list[dict[str, Any]]
) -> ClaimPreparation:
    """After the kill: restart, every claim all there or all gone; then Prepare yields specs
    that exist, and Unprepare removes everything."""
    preparation = restart(node, preparation)
    assert {uid(c): state(node, c) for c in made} == {
        uid(c): s for c in made if (s := state(node, c)) in (PREPARED, ABSENT)
    }
    out = preparation.prepare([ref(c) for c in made])
    for c in made:
        assert out[uid(c)].error == ""
        assert state(node, c) == PREPARED
        assert spec_path(node.cdi_root, uid(c)).exists()
    assert preparation.unprepare([ref(c) for c in made]) == {uid(c): "" for c in made}
    assert [state(node, c) for c in made] == [ABSENT] * len(made)
    return preparation


@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize(("effect", "nth"), PREPARE_STEPS)
def test_kill_during_prepare(sim: Node, effect: str, nth: int, when: str) -> None:
    made = claims(sim)
    preparation = sim.preparation()
    with patched(sim, preparation, effect, when, nth), pytest.raises(Killed):
        preparation.prepare([ref(c) for c in made])
    check_recovers(sim, preparation, made).close()


@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize(("effect", "nth"), UNPREPARE_STEPS)
def test_kill_during_unprepare(sim: Node, effect: str, nth: int, when: str) -> None:
    made = claims(sim)
    preparation = sim.preparation()
    assert all(not o.error for o in preparation.prepare([ref(c) for c in made]).values())
    with patched(sim, preparation, effect, when, nth), pytest.raises(Killed):
        preparation.unprepare([ref(c) for c in made])
    check_recovers(sim, preparation, made).close()


def test_unprepare_killed_after_the_spec_went_leaves_no_record(sim: Node) -> None:
    """The issue's trial: record kept, spec gone, and Prepare then answered a dead CDI ID."""
    [claim, _] = claims(sim)
    preparation = sim.preparation()
    assert preparation.prepare([ref(claim)])[uid(claim)].error == ""
    with patched(sim, preparation, "remove", "after", 1), pytest.raises(Killed):
        preparation.unprepare([ref(claim)])
    preparation = restart(sim, preparation)
    assert state(sim, claim) in (PREPARED, ABSENT)
    [device] = preparation.prepare([ref(claim)])[uid(claim)].devices
    assert spec_path(sim.cdi_root, uid(claim)).exists()
    assert state(sim, claim) == PREPARED
    assert device.share_id
    assert device.cdi_device_ids[0].endswith(f"{device.device}-{device.share_id}")
    preparation.close()


def test_prepare_of_a_recorded_claim_recreates_missing_artifacts(sim: Node) -> None:
    [claim, _] = claims(sim)
    preparation = sim.preparation()
    first = preparation.prepare([ref(claim)])[uid(claim)]
    spec_path(sim.cdi_root, uid(claim)).unlink()
    for d in pipe_dirs(sim.root / "run", uid(claim)):
        d.rmdir()
    again = preparation.prepare([ref(claim)])[uid(claim)]
    assert again == first
    assert state(sim, claim) == PREPARED
    preparation.close()


def test_start_up_recreates_the_spec_of_a_recorded_claim(sim: Node) -> None:
    """A record without its spec (as an older version's killed Unprepare left it)."""
    [claim, _] = claims(sim)
    preparation = sim.preparation()
    preparation.prepare([ref(claim)])
    spec = spec_path(sim.cdi_root, uid(claim))
    written = spec.read_text()
    spec.unlink()
    preparation = restart(sim, preparation)
    assert spec.read_text() == written
    assert state(sim, claim) == PREPARED
    preparation.close()


def test_start_up_removes_enforcement_of_unrecorded_claims(sim: Node) -> None:
    [claim, other] = claims(sim)
    preparation = sim.preparation()
    preparation.prepare([ref(other)])
    with patched(sim, preparation, "apply", "after", 1), pytest.raises(Killed):
        preparation.prepare([ref(claim)])
    assert pipe_dirs(sim.root / "run", uid(claim))
    preparation = restart(sim, preparation)
    assert state(sim, claim) == ABSENT
    assert state(sim, other) == PREPARED
    preparation.close()


def test_the_real_enforcer_says_whether_a_plan_is_enforced(tmp_path: Path) -> None:
    fake = plans.Node(tmp_path)
    p = plans.plan(plans.device(fake.gpus[0], 10 * plans.GIB))
    assert not fake.enforcer.enforced(p)
    fake.enforcer.apply(p)
    assert fake.enforcer.enforced(p)
    assert not fake.enforcer.enforced(plans.plan(plans.device(fake.gpus[0], 9 * plans.GIB)))
    shutil.rmtree(fake.pipe("time-slicing") / "gpu_0" / namespace_name(p.claim.uid))
    assert not fake.enforcer.enforced(p)
    fake.enforcer.apply(p)
    assert fake.enforcer.enforced(p)
    fake.enforcer.release(p.claim.uid)
    assert not fake.enforcer.enforced(p)


def test_the_simulated_enforcer_removes_what_claims_it_does_not_know_left(tmp_path: Path) -> None:
    options = MpsOptions(root=str(tmp_path / "run"))
    gpus = [plans.gpu(0), plans.gpu(1)]
    kept = plans.plan(plans.device(gpus[0], 10 * plans.GIB))
    two_gpus = plans.plan(*(plans.device(g, 10 * plans.GIB, name=f"d{g.index}") for g in gpus))
    single = plans.plan(plans.device(gpus[1], 10 * plans.GIB))
    first = RecordingEnforcer(make_dirs=True, options=options)
    for p in (kept, two_gpus, single):
        first.apply(p)
    assert all(first.enforced(p) for p in (kept, two_gpus, single))
    restarted = RecordingEnforcer(make_dirs=True, options=options)
    restarted.restore([kept])
    assert restarted.enforced(kept)
    mps = tmp_path / "run" / "mps"
    assert pipe_dirs(tmp_path / "run", kept.claim.uid)
    assert not pipe_dirs(tmp_path / "run", two_gpus.claim.uid)
    assert not list(mps.glob("*/pipe/m_*"))
    assert not pipe_dirs(tmp_path / "run", single.claim.uid)
    again = RecordingEnforcer(make_dirs=True, options=options)
    again.release(kept.claim.uid)  # a claim this process never saw: removed by UID
    assert not pipe_dirs(tmp_path / "run", kept.claim.uid)
