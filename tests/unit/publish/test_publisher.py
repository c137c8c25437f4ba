"""SlicePublisher against an in-memory ResourceV1Api fake that counts write calls, plus one
round trip through the real ``kubernetes.client.ResourceV1Api`` over HTTP to a stub server."""

from __future__ import annotations

import copy
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.config.node import GpuConfig, NodeConfig
from dra_driver.gpus import Inventory, SimulatedGpuSource
from dra_driver.infra.metrics import Metrics
from dra_driver.publish.devicetaints import GPU_LOST, MPS_CHECK_FAILED, DeviceTaint, taint_key
from dra_driver.publish.publisher import PublishError, SlicePublisher, is_retryable
from dra_driver.publish.slicediff import normalize_spec
from dra_driver.publish.slices import build_slices
from tests.support.apiserver_stub import ApiStub, StubError

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-a"
SERIALIZER = k8s.ApiClient()
DEFAULTS = NodeConfig()
CAPACITY = NodeConfig(defaults=GpuConfig(fraction_model="capacity"))
"""Every GPU on the capacity model: devices with ``memory`` quantities in bytes."""
BIG = "simulated:H200x8,L4x8"
"""16 GPUs: two counter slices and one device slice, one slice more than an H200x8 node."""


def inventory(spec: str = "simulated:H200x8", node: str = NODE) -> Inventory:
    return SimulatedGpuSource(spec, seed=node).discover()


def desired(
    spec: str = "simulated:H200x8",
    node: str = NODE,
    config: NodeConfig = DEFAULTS,
    **kw: Any,
) -> list[dict[str, Any]]:
    """The node's slices; H200x8 with the default configuration: a counter slice and a device
    slice."""
    return build_slices(inventory(spec, node), config, DRIVER, node, **kw)


class Store:
    """Cluster-scoped ResourceSlices by name, with resourceVersion and a field selector."""

    def __init__(self, transform: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.transform = transform  # what the server does to a stored object

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
        if self.transform:
            self.transform(obj)
        self.objects[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def list(self, selector: str) -> list[dict[str, Any]]:
        want = dict(term.split("=", 1) for term in selector.split(",")) if selector else {}
        fields = {"spec.nodeName": "nodeName", "spec.driver": "driver"}
        return [
            copy.deepcopy(o)
            for _, o in sorted(self.objects.items())
            if all(o["spec"].get(fields[k]) == v for k, v in want.items())
        ]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] in self.objects:
            raise StubError(409, "AlreadyExists")
        return self._stamp(copy.deepcopy(obj))

    def replace(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        old = self.objects.get(name)
        if old is None:
            raise StubError(404, "NotFound")
        if obj["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            raise StubError(409, "Conflict")
        if obj["spec"]["pool"]["name"] != old["spec"]["pool"]["name"]:
            raise StubError(422, "Invalid: spec.pool.name is immutable")
        obj = copy.deepcopy(obj)
        obj["metadata"]["uid"] = old["metadata"]["uid"]
        return self._stamp(obj)

    def delete(self, name: str) -> dict[str, Any]:
        if name not in self.objects:
            raise StubError(404, "NotFound")
        return self.objects.pop(name)


class FakeResourceV1Api:
    """The four ResourceV1Api methods the publisher calls, taking and returning the client's
    models as the real one does; counts calls, injects failures (``ApiException``)."""

    def __init__(self, store: Store | None = None, honor_selector: bool = True) -> None:
        self.api_client = SERIALIZER
        self.store = store or Store()
        self.calls: Counter[str] = Counter()
        self.failures: dict[str, list[Exception]] = {}
        self.honor_selector = honor_selector

    @property
    def writes(self) -> int:
        return self.calls["create"] + self.calls["replace"] + self.calls["delete"]

    def fail(self, method: str, *excs: Exception) -> None:
        self.failures.setdefault(method, []).extend(excs)

    def _call(self, method: str, fn: Callable[[], Any]) -> Any:
        self.calls[method] += 1
        if self.failures.get(method):
            raise self.failures[method].pop(0)
        try:
            return fn()
        except StubError as exc:
            raise ApiException(status=exc.status, reason=exc.reason) from None

    def list_resource_slice(self, *, field_selector: str) -> Any:
        selector = field_selector if self.honor_selector else ""
        items = self._call("list", lambda: self.store.list(selector))
        return k8s.V1ResourceSliceList(
            items=[k8s.V1ResourceSlice.from_dict(o) for o in items], metadata=k8s.V1ListMeta()
        )

    def create_resource_slice(self, body: Any) -> Any:
        assert isinstance(body, k8s.V1ResourceSlice)
        obj = SERIALIZER.sanitize_for_serialization(body)
        return k8s.V1ResourceSlice.from_dict(self._call("create", lambda: self.store.create(obj)))

    def replace_resource_slice(self, name: str, body: Any) -> Any:
        assert isinstance(body, k8s.V1ResourceSlice)
        obj = SERIALIZER.sanitize_for_serialization(body)
        stored = self._call("replace", lambda: self.store.replace(name, obj))
        return k8s.V1ResourceSlice.from_dict(stored)

    def delete_resource_slice(self, name: str) -> Any:
        return k8s.V1ResourceSlice.from_dict(self._call("delete", lambda: self.store.delete(name)))


def publisher(api: Any, node: str = NODE, **kw: Any) -> tuple[SlicePublisher, list[float]]:
    sleeps: list[float] = []
    return SlicePublisher(api, DRIVER, node, sleep=sleeps.append, **kw), sleeps


def pool_state(store: Store, node: str = NODE) -> set[tuple[int, int]]:
    """{(generation, resourceSliceCount)} over the node's slices: one entry when consistent."""
    return {
        (o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"])
        for o in store.objects.values()
        if o["spec"]["nodeName"] == node
    }


def store_devices(store: Store) -> list[dict[str, Any]]:
    return [d for o in store.objects.values() for d in o["spec"].get("devices", [])]


def stored_specs(store: Store, node: str = NODE) -> dict[str, dict[str, Any]]:
    return {n: o["spec"] for n, o in store.objects.items() if o["spec"]["nodeName"] == node}


# --- tests ---------------------------------------------------------------------------------


def test_first_publish_creates_then_nothing_changes() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    want = desired()
    result = pub.publish(want)
    assert result.created == tuple(s["metadata"]["name"] for s in want)
    assert result.updated == result.deleted == ()
    assert result.generations == {NODE: 1}
    assert api.writes == 2 and pool_state(api.store) == {(1, 2)}
    assert {n: normalize_spec(s) for n, s in stored_specs(api.store).items()} == {
        s["metadata"]["name"]: normalize_spec(s["spec"]) for s in want
    }

    again = pub.publish(desired())
    assert again.writes == 0 and not again.changed
    assert api.writes == 2
    assert again.generations == {NODE: 1}


def test_restart_writes_nothing_and_deletes_nothing() -> None:
    api = FakeResourceV1Api()
    publisher(api)[0].publish(desired())
    api.calls.clear()
    fresh, _ = publisher(api)  # a new plugin process, same inventory
    result = fresh.publish(desired())
    assert api.writes == 0 and result.writes == 0
    assert len(api.store.objects) == 2


def test_changed_content_updates_every_slice_with_bumped_generation() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired())
    gpu3 = inventory().gpus[3]
    api.calls.clear()
    result = pub.publish(desired(enforcement={gpu3.uuid: "hard"}))
    # only the device slice changed in content, but the pool generation moves for all
    assert sorted(result.updated) == sorted(api.store.objects)
    assert result.created == result.deleted == ()
    assert result.generations == {NODE: 2}
    assert pool_state(api.store) == {(2, 2)}
    assert api.calls["replace"] == 2 and api.calls["create"] == 0
    enforced = [
        d["attributes"]["memoryEnforcement"]["string"]
        for o in api.store.objects.values()
        for d in o["spec"].get("devices", [])
        if d["attributes"]["index"]["int"] == 3
    ]
    assert set(enforced) == {"hard"}
    api.calls.clear()
    assert pub.publish(desired(enforcement={gpu3.uuid: "hard"})).writes == 0


def test_fewer_gpus_deletes_stale_slice_and_recounts() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired(BIG))
    result = pub.publish(desired("simulated:H200x8"))  # 8 GPUs: 1 counter + 1 device slice
    assert result.deleted == (f"{NODE}-gpu-fraction-dra-dev-2",)
    assert len(result.updated) == 2
    assert pool_state(api.store) == {(2, 2)}
    assert sorted(api.store.objects) == [f"{NODE}-gpu-fraction-dra-dev-{n}" for n in (0, 1)]
    result = pub.publish([])
    assert len(result.deleted) == 2 and api.store.objects == {}


def test_more_gpus_creates_with_the_new_generation() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired("simulated:H200x8"))
    result = pub.publish(desired(BIG))
    assert result.created == (f"{NODE}-gpu-fraction-dra-dev-2",)
    assert pool_state(api.store) == {(2, 3)}


def test_other_nodes_and_drivers_untouched() -> None:
    store = Store()
    other_node = desired(node="node-b")
    other_driver = copy.deepcopy(desired("simulated:L4x1"))
    for s in other_driver:
        s["spec"]["driver"] = "other.example.com"
        s["metadata"]["name"] = "other-" + s["metadata"]["name"]
    for s in other_node + other_driver:
        store.create(s)
    before = copy.deepcopy(store.objects)
    for honor in (True, False):  # even a server that ignores the field selector
        api = FakeResourceV1Api(store, honor_selector=honor)
        pub, _ = publisher(api)
        pub.publish(desired("simulated:H200x2"))
        pub.publish([])
        assert store.objects == before


def test_semantically_equal_quantities_are_not_rewritten() -> None:
    store = Store()
    want = desired("simulated:H200x1", config=CAPACITY)
    [gpu] = inventory("simulated:H200x1").gpus
    for s in copy.deepcopy(want):  # as if another client had written plain byte counts
        for d in s["spec"].get("devices", []):
            memory = d["capacity"]["memory"]
            memory["value"] = str(gpu.memory_bytes)
            memory["requestPolicy"]["validRange"]["min"] = str(1024**3)
        store.create(s)
    assert any(
        d["capacity"]["memory"]["value"] == str(gpu.memory_bytes) for d in store_devices(store)
    )
    api = FakeResourceV1Api(store)
    assert publisher(api)[0].publish(want).writes == 0


def test_server_that_drops_fields_is_not_fought() -> None:
    def drop_counters(obj: dict[str, Any]) -> None:  # e.g. DRAPartitionableDevices disabled
        for d in obj["spec"].get("devices", []):
            d.pop("consumesCounters", None)

    api = FakeResourceV1Api(Store(transform=drop_counters))
    pub, _ = publisher(api)
    assert pub.publish(desired("simulated:L4x2")).writes == 2
    assert pub.publish(desired("simulated:L4x2")).writes == 0


def test_an_unchanged_taint_writes_nothing() -> None:
    """The stored ``timeAdded`` comes back from the client as ``...+00:00``, not as the ``Z``
    sent: the same taint is no change, for this publisher and a restarted one, and is not
    taken for a server that altered the slice."""
    gpu = inventory().gpus[2]
    lost = DeviceTaint(taint_key(DRIVER), GPU_LOST, "2026-03-01T12:00:00Z")
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired())
    api.calls.clear()
    assert pub.publish(desired(taints={gpu.uuid: lost})).writes == 2
    stored = [d["taints"] for d in store_devices(api.store) if "taints" in d]
    assert stored and all(
        t == [{**lost.body(), "timeAdded": "2026-03-01T12:00:00+00:00"}] for t in stored
    )
    for again in (pub, publisher(api)[0]):
        api.calls.clear()
        assert again.publish(desired(taints={gpu.uuid: lost})).writes == 0
        assert api.writes == 0
    assert pub._server_forms == {}
    failed = DeviceTaint(taint_key(DRIVER), MPS_CHECK_FAILED, "2026-03-01T12:00:00Z")
    assert pub.publish(desired(taints={gpu.uuid: failed})).writes == 2
    assert pub.publish(desired()).writes == 2  # healthy again: the taint goes
    assert not [d for d in store_devices(api.store) if "taints" in d]


def test_foreign_labels_and_annotations_kept_on_update() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired("simulated:L4x1"))
    name = next(iter(api.store.objects))
    api.store.objects[name]["metadata"]["labels"]["team"] = "ml"
    api.store.objects[name]["metadata"]["annotations"] = {"note": "x"}
    assert pub.publish(desired("simulated:L4x1")).writes == 0  # extra labels are not a change
    pub.publish(
        desired("simulated:L4x1", enforcement={inventory("simulated:L4x1").gpus[0].uuid: "hard"})
    )
    meta = api.store.objects[name]["metadata"]
    assert meta["labels"]["team"] == "ml" and meta["annotations"] == {"note": "x"}
    assert meta["labels"]["app.kubernetes.io/managed-by"] == DRIVER


def test_removed_own_label_is_restored() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired("simulated:L4x1"))
    name = next(iter(api.store.objects))
    del api.store.objects[name]["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert pub.publish(desired("simulated:L4x1")).writes == 2
    assert pool_state(api.store) == {(2, 2)}


def test_older_stale_slice_is_deleted_without_bumping() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired(BIG))
    pub.publish(desired("simulated:H200x8"))
    # a stale slice of generation 1 reappears (e.g. a deletion that failed earlier)
    stale = desired(BIG)[2]
    api.store.create(stale)
    api.calls.clear()
    result = pub.publish(desired("simulated:H200x8"))
    assert result.deleted == (stale["metadata"]["name"],) and result.updated == ()
    assert result.generations == {NODE: 2}


def test_renamed_pool_is_recreated() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired("simulated:L4x1"))
    moved = copy.deepcopy(desired("simulated:L4x1"))
    for s in moved:
        s["spec"]["pool"]["name"] = "node-a-pool"
    result = pub.publish(moved)
    assert len(result.deleted) == 2 and len(result.created) == 2
    assert {o["spec"]["pool"]["name"] for o in api.store.objects.values()} == {"node-a-pool"}


def test_api_errors_are_retried_with_capped_backoff() -> None:
    api = FakeResourceV1Api()
    pub, sleeps = publisher(api, initial_backoff=1.0, max_backoff=3.0)
    api.fail("list", ApiException(status=500, reason="etcd timeout"))
    api.fail("create", ApiException(status=429, reason="throttled"))
    api.fail("create", ConnectionRefusedError("refused"))
    result = pub.publish(desired())
    assert result.attempts == 4
    assert sleeps == [1.0, 2.0, 3.0]
    assert pool_state(api.store) == {(1, 2)}
    assert api.calls["create"] == 4  # 2 failed + 2 created


def test_partial_failure_leaves_a_consistent_pool() -> None:
    api = FakeResourceV1Api()
    pub, sleeps = publisher(api)
    pub.publish(desired("simulated:H200x8"))
    gpu = inventory().gpus[0]
    original = api.replace_resource_slice
    calls = {"n": 0}

    def flaky_replace(name: str, body: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # after one good replace
            raise ApiException(status=503, reason="unavailable")
        return original(name=name, body=body)

    api.replace_resource_slice = flaky_replace  # type: ignore[method-assign]
    result = pub.publish(desired("simulated:H200x8", enforcement={gpu.uuid: "cooperative"}))
    assert result.attempts == 2 and sleeps == [0.5]
    assert len(pool_state(api.store)) == 1  # every slice has the same generation and count
    api.replace_resource_slice = original  # type: ignore[method-assign]
    api.calls.clear()
    assert (
        pub.publish(desired("simulated:H200x8", enforcement={gpu.uuid: "cooperative"})).writes == 0
    )


def test_non_retryable_error_raises_at_once() -> None:
    api = FakeResourceV1Api()
    pub, sleeps = publisher(api)
    api.fail("create", ApiException(status=422, reason="Invalid"))
    with pytest.raises(PublishError, match="Invalid") as err:
        pub.publish(desired())
    assert sleeps == [] and isinstance(err.value.__cause__, ApiException)


def test_retries_exhausted() -> None:
    api = FakeResourceV1Api()
    pub, sleeps = publisher(api, max_attempts=6, initial_backoff=0.5, max_backoff=4.0)
    api.fail("list", *[ApiException(status=503, reason="down") for _ in range(10)])
    with pytest.raises(PublishError, match="after 6 attempts"):
        pub.publish(desired())
    assert sleeps == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert api.writes == 0


def test_delete_of_vanished_slice_is_fine() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api)
    pub.publish(desired("simulated:L4x1"))
    api.fail("delete", ApiException(status=404, reason="NotFound"))
    result = pub.publish([])
    assert len(result.deleted) == 2 and result.attempts == 1


def test_failed_calls_are_counted_by_operation_and_reason() -> None:
    api = FakeResourceV1Api()
    metrics = Metrics()
    pub = SlicePublisher(api, DRIVER, NODE, sleep=lambda _: None, metrics=metrics)

    def failures(operation: str, reason: str) -> float | None:
        labels = {"operation": operation, "reason": reason}
        name = "dra_gpu_fraction_slice_publish_failures_total"
        return metrics.registry.get_sample_value(name, labels)

    api.fail("list", ApiException(status=503, reason="unavailable"))
    api.fail("create", ApiException(status=409, reason="Conflict"), ConnectionRefusedError())
    assert pub.publish(desired("simulated:L4x1")).attempts == 4  # three failed attempts
    assert failures("list", "503") == 1
    assert failures("create", "409") == 1 and failures("create", "connection") == 1
    api.fail("replace", ApiException(status=422, reason="Invalid"))
    gpu = inventory("simulated:L4x1").gpus[0]
    with pytest.raises(PublishError, match="Invalid"):
        pub.publish(desired("simulated:L4x1", enforcement={gpu.uuid: "hard"}))
    assert failures("update", "422") == 1
    api.fail("delete", ApiException(status=404, reason="NotFound"))  # already gone: fine
    assert len(pub.publish([]).deleted) == 2
    assert failures("delete", "404") is None
    assert failures("update", "409") is None


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (ApiException(status=409), True),
        (ApiException(status=500), True),
        (ApiException(status=0), True),
        (ApiException(status=403), False),
        (ApiException(status=422), False),
        (TimeoutError(), True),
        (ValueError("bug"), False),
    ],
)
def test_is_retryable(exc: Exception, retry: bool) -> None:
    assert is_retryable(exc) is retry


def test_rejects_foreign_or_duplicate_desired() -> None:
    pub, _ = publisher(FakeResourceV1Api())
    with pytest.raises(ValueError, match="not for node"):
        pub.publish(desired(node="node-b"))
    twice = desired("simulated:L4x1")
    with pytest.raises(ValueError, match="duplicate"):
        pub.publish(twice + twice[:1])


def test_run_loop_publishes_survives_errors_and_stops() -> None:
    api = FakeResourceV1Api()
    pub, _ = publisher(api, max_attempts=1)
    stop = threading.Event()
    rounds: list[int] = []

    def want() -> list[dict[str, Any]]:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise RuntimeError("discovery failed")
        if len(rounds) >= 4:
            stop.set()
        return desired("simulated:L4x1")

    api.fail("list", ApiException(status=500, reason="boom"))  # round 1 fails publishing
    thread = threading.Thread(target=pub.run, args=(stop, want, 0.01))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(rounds) >= 3
    assert len(api.store.objects) == 2  # published by a later round, left in place on stop


def test_default_backoff_wait_is_interrupted_by_stop() -> None:
    api = FakeResourceV1Api()
    pub = SlicePublisher(api, DRIVER, NODE, initial_backoff=60.0)
    stop = threading.Event()
    api.fail("list", *[ApiException(status=503) for _ in range(3)])
    thread = threading.Thread(target=pub.run, args=(stop, lambda: desired("simulated:L4x1"), 60))
    thread.start()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


# --- the real client over HTTP -------------------------------------------------------------


class SliceServer(ApiStub):
    """Serves resource.k8s.io/v1 ResourceSlice list/create/replace/delete from a Store."""

    PREFIX = "/apis/resource.k8s.io/v1/resourceslices"

    def __init__(self) -> None:
        super().__init__()
        self.store = Store()
        self.methods: Counter[str] = Counter()

    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.methods[method] += 1
        url = urllib.parse.urlsplit(path)
        name = url.path[len(SliceServer.PREFIX) + 1 :] or None
        if method == "GET" and name is None:
            query = urllib.parse.parse_qs(url.query)
            items = self.store.list(query.get("fieldSelector", [""])[0])
            out = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList"}
            return 200, {**out, "metadata": {}, "items": items}
        if method == "POST":
            return 201, self.store.create(body)
        if method == "PUT" and name:
            return 200, self.store.replace(name, body)
        if method == "DELETE" and name:
            return 200, self.store.delete(name)
        raise StubError(405, "MethodNotAllowed")

    def api(self) -> Any:
        return k8s.ResourceV1Api(self.api_client())


def test_real_client_round_trip() -> None:
    with SliceServer() as server:
        server.store.create(desired(node="node-b")[0])
        pub = SlicePublisher(server.api(), DRIVER, NODE, sleep=lambda _: None)
        first = pub.publish(desired())
        assert len(first.created) == 2 and server.methods["POST"] == 2
        server.methods.clear()
        assert SlicePublisher(server.api(), DRIVER, NODE).publish(desired()).writes == 0
        assert dict(server.methods) == {"GET": 1}
        gpu = inventory().gpus[0]
        changed = pub.publish(desired(enforcement={gpu.uuid: "hard"}))
        assert len(changed.updated) == 2 and server.methods["PUT"] == 2
        assert pool_state(server.store) == {(2, 2)}
        assert pub.publish([]).deleted and list(server.store.objects) == [
            "node-b-gpu-fraction-dra-dev-0"
        ]
