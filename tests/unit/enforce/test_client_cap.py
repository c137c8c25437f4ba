"""The per-claim client cap (issue 26, item 2): a claim's share of the MPS server's client
table follows the memory it bought, and the clients beyond it that go are the newest, never a
neighbour's or the default namespace's."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.enforce.rules.clientcap import (
    CLIENT_TABLE_SIZE,
    CapGroup,
    cap_groups,
    client_cap,
    contexts_per_client,
    first_seen,
    over_cap,
    plan_terminations,
)
from dra_driver.enforce.rules.rows import ClientRow
from dra_driver.enforce.rules.targets import targets_for_claim
from dra_driver.model.devices import portion_bytes
from dra_driver.model.gpu import MIB
from dra_driver.model.plans import ClaimRef
from dra_driver.mpsemu.server import CLIENT_TABLE
from tests.support.fakes.plans import GIB, H200_MIB, device, gpu, plan

H200 = H200_MIB * MIB
CLAIM = ClaimRef("team-a", "train", "uid-a")
UID_SINGLE = "0a000000-0000-4000-8000-00000000000a"
UID_MULTI = "0b000000-0000-4000-8000-00000000000b"
UID_NONE = "0c000000-0000-4000-8000-00000000000c"


def test_the_table_is_mps_s_and_the_emulator_s() -> None:
    assert CLIENT_TABLE_SIZE == CLIENT_TABLE == 60


@pytest.mark.parametrize(
    ("portion", "cap"),
    [(Fraction(1, 8), 7), (Fraction(1, 4), 15), (Fraction(1, 2), 30), (Fraction(1), 60)],
)
def test_a_product_s_cap_is_its_share_of_the_table(portion: Fraction, cap: int) -> None:
    # product sizes are rounded down to whole MiB: a quarter of an H200 is 35942 MiB, not
    # 35942.75, and still gets its 15
    assert client_cap(portion_bytes(H200, portion), H200) == cap


def test_a_tiny_claim_still_gets_one_client_and_none_gets_more_than_the_table() -> None:
    assert client_cap(0, H200) == 1
    assert client_cap(GIB, H200) == 1  # 1/140 of the card
    assert client_cap(2 * H200, H200) == CLIENT_TABLE_SIZE


@pytest.mark.parametrize(
    ("request_bytes", "memory", "table"), [(-1, H200, 60), (1, 0, 60), (1, 1, 0)]
)
def test_a_cap_of_nonsense_is_refused(request_bytes: int, memory: int, table: int) -> None:
    with pytest.raises(ValueError, match="needs a request >= 0"):
        client_cap(request_bytes, memory, table)


@given(
    st.integers(16 * 1024, 200 * 1024).map(lambda mib: mib * MIB),
    st.lists(st.integers(1, 64), min_size=1, max_size=12),
)
def test_products_that_fit_a_card_never_claim_more_than_its_table(
    card: int, denominators: list[int]
) -> None:
    portions = [Fraction(1, d) for d in denominators]
    while sum(portions) > 1:  # what the scheduler allows on one card
        portions.pop()
    caps = [client_cap(portion_bytes(card, p), card) for p in portions]
    assert sum(caps) <= CLIENT_TABLE_SIZE + sum(1 for p in portions if p < Fraction(1, 60))
    for p, cap in zip(portions, caps, strict=True):
        assert cap == max(1, int(60 * p))  # exactly the share, whatever the card's size


@given(
    st.integers(1024, 200 * 1024).map(lambda mib: mib * MIB),
    st.lists(st.integers(0, 2**40), min_size=1, max_size=40),
)
def test_requests_that_fit_a_card_never_claim_more_than_its_table(
    card: int, requests: list[int]
) -> None:
    while sum(requests) > card:
        requests.pop()
    caps = [client_cap(r, card) for r in requests]
    below = sum(1 for r in requests if 60 * (r + MIB) < card)  # those get 1 all the same
    assert sum(caps) <= CLIENT_TABLE_SIZE + below


def test_cap_groups_one_per_namespace_and_the_smallest_cap_of_a_multi_gpu_claim() -> None:
    g0, g1, small = gpu(0), gpu(1), gpu(2, memory_mib=H200_MIB // 2)
    single = targets_for_claim(plan(device(g0, H200 // 8), uid=UID_SINGLE), {g0.uuid: "hard"})
    spread = targets_for_claim(
        plan(
            device(g1, H200 // 4, name="gpu-1-quarter-0"),
            device(small, H200 // 4, name="gpu-2-quarter-0"),
            uid=UID_MULTI,
        ),
        {g1.uuid: "hard", small.uuid: "hard"},
    )
    unenforced = targets_for_claim(plan(device(g0, GIB), uid=UID_NONE), {})
    groups = cap_groups([*single, *spread, *unenforced])
    assert [(g.claim.uid, g.server, g.namespace, g.gpu_uuid, g.cap) for g in groups] == [
        (UID_SINGLE, "gpu_0", "c_" + UID_SINGLE.replace("-", "_"), g0.uuid, 7),
        # a quarter of g1, half of the smaller card: the smaller cap binds
        (UID_MULTI, "m_" + UID_MULTI.replace("-", "_"), "claim", g1.uuid, 15),
    ]


def rows(*spec: tuple[int, str], server: str = "gpu_0", device: str = "0") -> list[ClientRow]:
    return [ClientRow(pid, server, device, ns, "python app.py") for pid, ns in spec]


def test_contexts_count_per_device_whatever_the_rows_per_client() -> None:
    listed = [
        *rows((10, "ns"), (10, "ns"), (11, "ns")),  # PID 10 made two contexts
        *rows((11, "ns"), device="1"),  # one client, one row per device (multi-GPU server)
    ]
    assert contexts_per_client(listed) == {10: 2, 11: 1}


def test_first_seen_keeps_old_ranks_ranks_new_pids_after_them_and_forgets_gone_ones() -> None:
    ranks = first_seen({}, [30, 10, 30, 20])
    assert ranks == {30: 0, 10: 1, 20: 2}
    later = first_seen(ranks, [5, 20, 30])  # 10 is gone; 5 is new, though a lower PID
    assert later == {30: 0, 20: 2, 5: 3}
    assert first_seen(later, [10]) == {10: 4}  # a PID back: a new client


def test_over_cap_ends_the_newest_and_a_process_goes_whole() -> None:
    rank = {1: 0, 2: 1, 3: 2, 4: 3}
    assert over_cap({1: 1, 2: 1, 3: 1, 4: 1}, 2, rank) == (4, 3)
    assert over_cap({1: 1, 2: 5, 3: 1, 4: 1}, 3, rank) == (2,)  # later ones still fit
    assert over_cap({1: 1, 2: 1}, 2, rank) == ()
    assert over_cap({9: 1, 1: 1}, 1, rank) == (9,)  # never seen: newest


@given(
    st.dictionaries(st.integers(1, 10_000), st.integers(1, 5), min_size=0, max_size=40),
    st.integers(0, 60),
    st.randoms(use_true_random=False),
)
def test_over_cap_keeps_what_fits_in_first_seen_order(
    contexts: dict[int, int], cap: int, rnd: random.Random
) -> None:
    order = list(contexts)
    rnd.shuffle(order)
    rank = {pid: i for i, pid in enumerate(order)}
    ending = over_cap(contexts, cap, rank)
    kept = [p for p in order if p not in ending]
    assert sum(contexts[p] for p in kept) <= cap
    assert set(ending) <= set(contexts) and len(set(ending)) == len(ending)
    assert list(ending) == sorted(ending, key=lambda p: -rank[p])  # newest first
    for p in ending:  # each one ended did not fit beside the earlier ones kept
        earlier = sum(contexts[k] for k in kept if rank[k] < rank[p])
        assert earlier + contexts[p] > cap
    if all(n == 1 for n in contexts.values()):
        assert kept == order[:cap]


def test_plan_terminations_touches_only_the_claim_over_its_cap() -> None:
    flood = CapGroup(CLAIM, "gpu_0", "c_a", "GPU-0", 2)
    neighbour = CapGroup(ClaimRef("team-b", "serve", "uid-b"), "gpu_0", "c_b", "GPU-0", 1)
    listed = rows(
        (1, "c_a"), (2, "c_b"), (3, "default"), (4, "c_a"), (5, "c_b"), (6, "c_a"), (7, "c_a")
    )
    listed += rows((7, "c_x"), server="gpu_1")  # PID 7 is also another namespace's client
    excess, ranks = plan_terminations(listed, [flood, neighbour], {})
    assert [(e.group.namespace, e.pids, e.spared, e.contexts) for e in excess] == [
        ("c_a", (6,), (7,), 4),  # PID 7 over the cap too, but ending it would end c_x's
        ("c_b", (5,), (), 2),
    ]
    assert ranks == {("gpu_0", "c_a"): {1: 0, 4: 1, 6: 2, 7: 3}, ("gpu_0", "c_b"): {2: 0, 5: 1}}
    # the default namespace, other servers and namespaces nobody claims are never chosen
    assert plan_terminations(rows(*((p, "default") for p in range(99))), [flood], {}) == ([], {})


def test_plan_terminations_keeps_clients_seen_in_an_earlier_check() -> None:
    group = CapGroup(CLAIM, "gpu_0", "c_a", "GPU-0", 2)
    _, ranks = plan_terminations(rows((900, "c_a")), [group], {})
    # PIDs 100 and 101 are listed first now, but 900 was there before them
    excess, _ = plan_terminations(rows((100, "c_a"), (101, "c_a"), (900, "c_a")), [group], ranks)
    assert [e.pids for e in excess] == [(101,)]
