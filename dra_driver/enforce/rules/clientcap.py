"""Pure decisions of the per-claim client cap: how many MPS clients a claim may hold on a
GPU, and which of its clients to terminate when it holds more.

MPS has no per-namespace client limit: a server's client table (:data:`CLIENT_TABLE_SIZE`
client CUDA contexts per device) is shared by every namespace on it, so one claim that opens
clients in a loop would leave its neighbours none (a client past the table fails its context
creation). The enforcer therefore reads ``client list`` and terminates each claim's clients
beyond its share (:mod:`dra_driver.enforce.clientguard`; ``docs/enforcement.md``, "Client
cap"):

- :func:`client_cap`: a claim's share of the table is proportional to the memory it bought
  of the GPU;
- :func:`cap_groups`: one cap per claim namespace on a server;
- :func:`contexts_per_client`, :func:`first_seen`, :func:`over_cap`: which clients go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_driver.enforce.rules.rows import ClientRow
from dra_driver.enforce.rules.targets import FractionTarget
from dra_driver.model.gpu import MIB
from dra_driver.model.plans import ClaimRef

CLIENT_TABLE_SIZE = 60
"""Client CUDA contexts one MPS server holds per device: 60 in the current NVIDIA MPS docs
("When to Use MPS", limitations; r590 and later, with the default
``CUDA_DEVICE_MAX_CONNECTIONS=2``: raising it lowers the count), 48 on CUDA 13.0 and before.
A client of a server with several devices holds a context on each, so it is also the number
of clients one server takes."""


ROUNDING_SLACK_BYTES = MIB
"""Added to a request before its share is taken: a product's memory is its portion of the
card rounded down to a whole MiB (:func:`dra_driver.model.devices.product_memory_bytes`), so
a quarter of a card is up to 1 MiB short of a quarter and would lose one client to the floor."""


def client_cap(request_bytes: int, gpu_memory_bytes: int, table: int = CLIENT_TABLE_SIZE) -> int:
    """Pure: how many client contexts a claim may hold on one GPU.

    ``max(1, min(table, floor(table * (request_bytes + 1 MiB) / gpu_memory_bytes)))``: a
    claim's share of the server's client table is the share of the GPU's memory it bought
    (:data:`ROUNDING_SLACK_BYTES` undoes the rounding of product sizes): an eighth of the card
    gets 7 of 60, a quarter 15, a half 30, the whole card 60. The scheduler never gives a
    GPU's claims more memory than the card has, so the caps of a GPU's claims add up to at most
    the table (as long as fewer than ``gpu_memory_bytes / (table * 1 MiB)`` claims share it,
    about 2,400 on an H200) and every claim keeps room for its own clients whatever its
    neighbours do; only a claim below ``1/table`` of the card, which still gets 1, can take
    room beyond its share.

    Args:
        request_bytes: the claim's memory request on this GPU (its guaranteed share), bytes.
        gpu_memory_bytes: the GPU's total memory, bytes.
        table: the server's client table (contexts per device).

    Raises:
        ValueError: ``gpu_memory_bytes`` or ``table`` below 1, or a negative request.
    """
    if gpu_memory_bytes < 1 or table < 1 or request_bytes < 0:
        raise ValueError(
            f"client cap of a {request_bytes}-byte request on a {gpu_memory_bytes}-byte GPU "
            f"with a table of {table}: needs a request >= 0 and a GPU and table >= 1"
        )
    share = table * (request_bytes + ROUNDING_SLACK_BYTES) // gpu_memory_bytes
    return max(1, min(table, share))


@dataclass(frozen=True)
class CapGroup:
    """The clients of one claim's namespace on one MPS server and the cap they share.

    Attributes:
        claim: the claim.
        server: its MPS server (``gpu_<index>``, or its own ``m_<uid>``).
        namespace: its namespace there (``c_<uid>``, or ``claim`` on its own server).
        gpu_uuid: the GPU whose cap binds (the claim's only GPU on a shared server).
        cap: client contexts the namespace may hold per device (:func:`client_cap`).
    """

    claim: ClaimRef
    server: str
    namespace: str
    gpu_uuid: str
    cap: int

    @property
    def log_fields(self) -> dict[str, str]:
        """``claim_uid``, ``namespace``, ``name`` (the claim's) and ``gpu`` of its log lines."""
        claim = self.claim
        return {"claim_uid": claim.uid, "namespace": claim.namespace, "name": claim.name,
                "gpu": self.gpu_uuid}  # fmt: skip


def cap_groups(targets: Iterable[FractionTarget]) -> list[CapGroup]:
    """Pure: one :class:`CapGroup` per ``(server, namespace)`` of the MPS ``targets``, in the
    order first met.

    A claim on one GPU has one target, so its cap is :func:`client_cap` of its request on
    that GPU. A multi-GPU claim has a target per GPU, all served by its own server (each
    client holds a context on every GPU of it): the smallest of their caps binds, with that
    target's GPU. Targets without MPS (tier ``none``) have no clients and no group.
    """
    groups: dict[tuple[str, str], CapGroup] = {}
    for t in targets:
        if not t.uses_mps:
            continue
        cap = client_cap(t.request_bytes, t.gpu.memory_bytes)
        key = (t.server, t.namespace)
        known = groups.get(key)
        if known is None or cap < known.cap:
            groups[key] = CapGroup(t.claim, t.server, t.namespace, t.gpu.uuid, cap)
    return list(groups.values())


def contexts_per_client(rows: Sequence[ClientRow]) -> dict[int, int]:
    """Pure: PID -> client contexts that process holds on one device of its server, from the
    ``client list`` rows of one namespace (in the order first listed).

    A process usually holds one context per device, but it may create more, and each takes a
    place in the table; whether ``client list`` prints one row per client or one per client
    and device on a server with several devices is not documented ([UNKNOWN]), so the count
    is the most rows a PID has for any one device.
    """
    per_device: dict[tuple[int, str], int] = {}
    for r in rows:
        per_device[(r.pid, r.device)] = per_device.get((r.pid, r.device), 0) + 1
    out: dict[int, int] = {}
    for (pid, _), n in per_device.items():
        out[pid] = max(out.get(pid, 0), n)
    return out


def first_seen(before: Mapping[int, int], listed: Sequence[int]) -> dict[int, int]:
    """Pure: PID -> first-seen rank (lower: seen earlier) of the PIDs ``listed`` now.

    A PID seen before keeps its rank; a new one is ranked after every rank given so far, in
    the order listed. PIDs no longer listed are forgotten, so a PID the kernel hands to a new
    process later counts as a new client.

    Args:
        before: the ranks the previous check returned (of one namespace).
        listed: the PIDs listed now, in ``client list`` order (repeats allowed).
    """
    after = max(before.values(), default=-1) + 1
    out: dict[int, int] = {}
    for pid in listed:
        if pid in out:
            continue
        if pid in before:
            out[pid] = before[pid]
        else:
            out[pid] = after
            after += 1
    return out


def over_cap(contexts: Mapping[int, int], cap: int, rank: Mapping[int, int]) -> tuple[int, ...]:
    """Pure: the PIDs to terminate so that one namespace's clients fit ``cap``, newest first.

    In first-seen order (``rank``, then PID), each process is kept when its contexts fit in
    what is left of the cap, and terminated otherwise: ``client terminate`` takes a PID, so a
    process goes with all its contexts. With one context per process (the usual CUDA client)
    this keeps exactly the ``cap`` clients seen earliest.

    Args:
        contexts: PID -> contexts it holds (:func:`contexts_per_client`).
        cap: the namespace's cap (>= 0).
        rank: PID -> first-seen rank (:func:`first_seen`); a PID without one counts as newest.
    """
    left = cap
    ending = []
    newest = max(rank.values(), default=0) + 1
    for pid in sorted(contexts, key=lambda p: (rank.get(p, newest), p)):
        if contexts[pid] <= left:
            left -= contexts[pid]
        else:
            ending.append(pid)
    return tuple(reversed(ending))


@dataclass(frozen=True)
class Excess:
    """One namespace over its cap and what to do about it.

    Attributes:
        group: the claim's namespace and its cap.
        pids: the PIDs to terminate, newest first.
        spared: PIDs over the cap that are also clients of another namespace or server of
            the daemon (terminating one would end those too): left alone.
        contexts: the client contexts the namespace holds (before any is terminated).
    """

    group: CapGroup
    pids: tuple[int, ...]
    spared: tuple[int, ...]
    contexts: int


Ranks = dict[tuple[str, str], dict[int, int]]
"""``(server, namespace)`` -> PID -> first-seen rank (:func:`first_seen`)."""


def plan_terminations(
    rows: Sequence[ClientRow],
    groups: Sequence[CapGroup],
    before: Mapping[tuple[str, str], Mapping[int, int]],
) -> tuple[list[Excess], Ranks]:
    """Pure: which clients of one control daemon to terminate, and the ranks to remember.

    Args:
        rows: ``client list`` of the daemon (every server's clients).
        groups: the claims' namespaces in that daemon (:func:`cap_groups`).
        before: the ranks the previous check returned.

    Returns:
        One :class:`Excess` per namespace over its cap, and the first-seen ranks of every
        group's clients now (groups without clients: none, so their PIDs are forgotten).
        Nothing outside ``groups`` is ever chosen: not the ``default`` namespace, not
        another claim's, and no PID that is also a client anywhere else.
    """
    mine: dict[tuple[str, str], list[ClientRow]] = {(g.server, g.namespace): [] for g in groups}
    where: dict[int, set[tuple[str, str]]] = {}
    for r in rows:
        key = (r.server, r.namespace)
        where.setdefault(r.pid, set()).add(key)
        if key in mine:
            mine[key].append(r)
    out: list[Excess] = []
    ranks: Ranks = {}
    for g in groups:
        key = (g.server, g.namespace)
        listed = mine[key]
        if not listed:
            continue
        ranks[key] = first_seen(before.get(key, {}), [r.pid for r in listed])
        contexts = contexts_per_client(listed)
        ending = over_cap(contexts, g.cap, ranks[key])
        if ending:
            spared = tuple(p for p in ending if where[p] != {key})
            pids = tuple(p for p in ending if p not in spared)
            out.append(Excess(g, pids, spared, sum(contexts.values())))
    return out, ranks
