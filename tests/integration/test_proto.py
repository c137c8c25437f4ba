"""The compiled protos match the kubelet's own ``.proto`` files and the Kubernetes API's, and
the stubs are fresh.

The reference is the ``k8s.io/kubelet`` Go module at the version ``hack/k8s-tools/go.mod``
pins (v0.37.2, the kubelet the e2e cluster runs). ``go mod download`` fetches it into the Go
module cache (or finds it there); its ``pkg/apis/.../api.proto`` files are compiled with
grpc_tools' protoc into ``FileDescriptorProto``s and compared, element by element, with the
descriptors of the modules in ``dra_driver/_proto``. The ResourceClaim subset the claim status
writer uses (``proto/k8s_resourceclaim.proto``) is compared field by field with the
``generated.proto`` files of ``k8s.io/api`` and ``k8s.io/apimachinery`` at the same version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from dra_driver._proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    k8s_resourceclaim_pb2,
    registration_pb2,
)
from tests.support.paths import REPO

K8S_TOOLS = REPO / "hack" / "k8s-tools"
KUBELET_MODULE = "k8s.io/kubelet"
# Upstream file (under the module's pkg/apis) -> our compiled module.
UPSTREAM = {
    "pluginregistration/v1/api.proto": registration_pb2,
    "dra/v1/api.proto": dra_v1_pb2,
    "dra/v1beta1/api.proto": dra_v1beta1_pb2,
    "dra-health/v1alpha1/api.proto": health_v1alpha1_pb2,
    "dra-health/v1/api.proto": health_v1_pb2,
}
FDP = descriptor_pb2.FieldDescriptorProto


def _module_dir(module: str = KUBELET_MODULE) -> Path:
    """Where the Go toolchain keeps the files of ``module`` as hack/k8s-tools/go.mod pins it."""
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "`go` is not on PATH: tests/integration/test_proto.py needs the Go toolchain to fetch "
            f"the {module} module (its .proto files) pinned in "
            "hack/k8s-tools/go.mod. Install Go (see hack/k8s-tools/go.mod for the version)."
        )
    run = subprocess.run(
        [go, "mod", "download", "-json", module],
        cwd=K8S_TOOLS,
        env={**os.environ, "GOWORK": "off"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    if run.returncode != 0:
        pytest.fail(
            f"`go mod download -json {module}` in hack/k8s-tools failed "
            f"(exit {run.returncode}):\n{run.stdout}{run.stderr}"
        )
    info = json.loads(run.stdout)
    if "Dir" not in info:
        pytest.fail(f"`go mod download` did not unpack {module}: {info}")
    return Path(info["Dir"])


@pytest.fixture(scope="module")
def upstream(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The kubelet's api.proto files compiled by protoc, keyed by their path under pkg/apis.

    The v0.37.2 files import nothing: no gogoproto options, no well-known types, so the only
    include path needed is ``pkg/apis`` itself. File options (``go_package``) say how Go code is
    generated and are not compared. Should a future version import gogoproto again (older
    kubelet APIs did), protoc fails here naming the import; the fix then is a stub
    ``gogoproto/gogo.proto`` on the include path declaring the extensions, since those options
    only steer the Go generator and change nothing on the wire.
    """
    apis = _module_dir() / "pkg" / "apis"
    out = tmp_path_factory.mktemp("upstream") / "kubelet.pb"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={apis}",
            f"--descriptor_set_out={out}",
            *UPSTREAM,
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, f"protoc failed on the upstream protos:\n{run.stderr}"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return {f.name: f for f in files}


def _field(f: descriptor_pb2.FieldDescriptorProto, oneofs: list[str]) -> dict[str, Any]:
    return {
        "number": f.number,
        "label": FDP.Label.Name(f.label),
        "type": FDP.Type.Name(f.type),
        "type_name": f.type_name,
        "proto3_optional": f.proto3_optional,
        "oneof": oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
        "default": f.default_value,
    }


def _enum(e: descriptor_pb2.EnumDescriptorProto) -> dict[str, int]:
    return {v.name: v.number for v in e.value}


def _describe(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """What of a file reaches the wire, keyed by full names so declaration order does not count.

    Left out on purpose: the file name and file options, and ``json_name`` (protoc records it
    in a descriptor set, the runtime's ``CopyToProto`` does not; it only matters for JSON).
    """
    pkg = fdp.package
    messages: dict[str, Any] = {}
    enums: dict[str, Any] = {}

    def walk(msgs: Any, msg_enums: Any, prefix: str) -> None:
        for e in msg_enums:
            enums[f"{prefix}.{e.name}"] = _enum(e)
        for m in msgs:
            full = f"{prefix}.{m.name}"
            oneofs = [o.name for o in m.oneof_decl]
            messages[full] = {
                "map_entry": m.options.map_entry,
                "oneofs": oneofs,
                "nested": sorted(n.name for n in m.nested_type),
                "fields": {f.name: _field(f, oneofs) for f in m.field},
            }
            walk(m.nested_type, m.enum_type, full)

    walk(fdp.message_type, fdp.enum_type, f".{pkg}")
    services = {
        f"{pkg}.{s.name}": {
            m.name: {
                "input": m.input_type,
                "output": m.output_type,
                "client_streaming": m.client_streaming,
                "server_streaming": m.server_streaming,
            }
            for m in s.method
        }
        for s in fdp.service
    }
    return {
        "package": pkg,
        "syntax": fdp.syntax,
        "dependencies": list(fdp.dependency),
        "messages": messages,
        "enums": enums,
        "services": services,
    }


@pytest.mark.parametrize("path", list(UPSTREAM))
def test_descriptors_match_kubelet_protos(
    path: str, upstream: dict[str, descriptor_pb2.FileDescriptorProto]
) -> None:
    ours_fdp = descriptor_pb2.FileDescriptorProto()
    UPSTREAM[path].DESCRIPTOR.CopyToProto(ours_fdp)
    theirs, ours = _describe(upstream[path]), _describe(ours_fdp)
    # Package, service and method names form the gRPC method path (/pkg.Service/Method) and the
    # message type names: ours must be the kubelet's, not merely look alike.
    assert ours["package"] == theirs["package"], path
    assert ours["syntax"] == theirs["syntax"], path
    assert ours["dependencies"] == theirs["dependencies"], path
    assert ours["services"] == theirs["services"], path
    assert ours["enums"] == theirs["enums"], path
    assert sorted(ours["messages"]) == sorted(theirs["messages"]), path
    for name, expected in theirs["messages"].items():
        got = ours["messages"][name]
        assert sorted(got["fields"]) == sorted(expected["fields"]), f"{path}: {name}"
        for field, shape in expected["fields"].items():
            assert got["fields"][field] == shape, f"{path}: {name}.{field}"
        assert got == expected, f"{path}: {name}"


def test_compared_descriptors_are_not_empty(
    upstream: dict[str, descriptor_pb2.FileDescriptorProto],
) -> None:
    """Guards the comparison above against comparing two empty descriptions."""
    dra = _describe(upstream["dra/v1/api.proto"])
    assert dra["services"][f"{dra['package']}.DRAPlugin"].keys() == {
        "NodePrepareResources",
        "NodeUnprepareResources",
    }
    health = _describe(upstream["dra-health/v1/api.proto"])
    watch = health["services"]["v1.DRAResourceHealth"]["NodeWatchResources"]
    assert watch["server_streaming"] and not watch["client_streaming"]
    reg = _describe(upstream["pluginregistration/v1/api.proto"])
    assert reg["package"] == "pluginregistration"
    assert {"Registration"} <= {s.split(".")[-1] for s in reg["services"]}


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "hack" / "gen-proto"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(REPO)
        for p in (REPO / "dra_driver" / "_proto").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert generated == committed
    for rel in generated:
        assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), (
            f"{rel} is stale: run hack/gen-proto"
        )


API_MODULES = ("k8s.io/api", "k8s.io/apimachinery")
RESOURCE_CLAIM = "k8s.io/api/resource/v1/generated.proto"
META = ".k8s.io.apimachinery.pkg.apis.meta.v1"
RUNTIME = ".k8s.io.apimachinery.pkg.runtime"
RESOURCE = ".k8s.io.api.resource.v1"
CORE = ".k8s.io.api.core.v1"
SUBSET = {
    "Unknown": f"{RUNTIME}.Unknown",
    "TypeMeta": f"{RUNTIME}.TypeMeta",
    "ResourceClaim": f"{RESOURCE}.ResourceClaim",
    "ObjectMeta": f"{META}.ObjectMeta",
    "ResourceClaimStatus": f"{RESOURCE}.ResourceClaimStatus",
    "AllocationResult": f"{RESOURCE}.AllocationResult",
    "NodeSelector": f"{CORE}.NodeSelector",
    "NodeSelectorTerm": f"{CORE}.NodeSelectorTerm",
    "NodeSelectorRequirement": f"{CORE}.NodeSelectorRequirement",
    "AllocatedDeviceStatus": f"{RESOURCE}.AllocatedDeviceStatus",
    "Condition": f"{META}.Condition",
    "Time": f"{META}.Time",
    "RawExtension": f"{RUNTIME}.RawExtension",
    "DeviceAllocationResult": f"{RESOURCE}.DeviceAllocationResult",
    "DeviceRequestAllocationResult": f"{RESOURCE}.DeviceRequestAllocationResult",
    "Quantity": ".k8s.io.apimachinery.pkg.api.resource.Quantity",
    "DeviceAllocationConfiguration": f"{RESOURCE}.DeviceAllocationConfiguration",
    "DeviceConfiguration": f"{RESOURCE}.DeviceConfiguration",
    "OpaqueDeviceConfiguration": f"{RESOURCE}.OpaqueDeviceConfiguration",
    "ResourceClaimConsumerReference": f"{RESOURCE}.ResourceClaimConsumerReference",
    "Status": f"{META}.Status",
}
"""Our message of the subset -> the Kubernetes API message it stands for."""


@pytest.fixture(scope="module")
def api_messages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Full name -> ``DescriptorProto`` of every message ResourceClaim's generated.proto
    defines or imports, compiled by protoc from the pinned modules."""
    out = tmp_path_factory.mktemp("api") / "api.pb"
    paths = [f"--proto_path={m}={_module_dir(m)}" for m in API_MODULES]
    run = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *paths, "--include_imports",
         f"--descriptor_set_out={out}", RESOURCE_CLAIM],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert run.returncode == 0, f"protoc failed on the Kubernetes API protos:\n{run.stderr}"
    messages = {}
    for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        for m in f.message_type:
            messages[f".{f.package}.{m.name}"] = m
    return messages


def test_resource_claim_subset_has_the_api_field_numbers(api_messages: dict[str, Any]) -> None:
    """Each field of the subset is the API's field of that name and number. A field the subset
    declares ``bytes`` where the API has a message carries the encoded message (same wire
    type, passed through unread); a message field must name the subset's stand-in for the
    API's message type."""
    ours = descriptor_pb2.FileDescriptorProto()
    k8s_resourceclaim_pb2.DESCRIPTOR.CopyToProto(ours)
    assert sorted(m.name for m in ours.message_type) == sorted(SUBSET)
    stand_in = {f".{ours.package}.{name}": full for name, full in SUBSET.items()}
    for message in ours.message_type:  # map fields: their entry types, nested in the message
        for entry in message.nested_type:
            stand_in[f".{ours.package}.{message.name}.{entry.name}"] = (
                f"{SUBSET[message.name]}.{entry.name}"
            )
            value = next(f for f in entry.field if f.name == "value")
            their_entry = next(
                n for n in api_messages[SUBSET[message.name]].nested_type if n.name == entry.name
            )
            their_value = next(f for f in their_entry.field if f.name == "value")
            assert stand_in[value.type_name] == their_value.type_name, entry.name
    for message in ours.message_type:
        theirs = {f.name: f for f in api_messages[SUBSET[message.name]].field}
        for field in message.field:
            where = f"{message.name}.{field.name}"
            assert field.name in theirs, f"{where}: no such field in {SUBSET[message.name]}"
            api = theirs[field.name]
            assert (field.number, field.label) == (api.number, api.label), where
            if field.type == FDP.TYPE_MESSAGE:
                assert api.type == FDP.TYPE_MESSAGE, where
                assert stand_in[field.type_name] == api.type_name, where
            elif field.type == FDP.TYPE_BYTES and api.type == FDP.TYPE_MESSAGE:
                continue
            else:
                assert field.type == api.type, where
