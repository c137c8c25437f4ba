"""The compiled protos match the kubelet's wire definitions, and the stubs are fresh."""

from __future__ import annotations

import json
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
    registration_pb2,
)

REPO = Path(__file__).resolve().parents[1]
WIRE = REPO.parent / "shared" / "reference" / "kubelet-wire.json"
MODULES = [registration_pb2, dra_v1_pb2, dra_v1beta1_pb2, health_v1alpha1_pb2, health_v1_pb2]
LABELS = {1: "LABEL_OPTIONAL", 2: "LABEL_REQUIRED", 3: "LABEL_REPEATED"}


def _type_name(t: int) -> str:
    return str(descriptor_pb2.FieldDescriptorProto.Type.Name(t))


def _describe(module: Any) -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)
    pkg = fdp.package
    messages: dict[str, Any] = {}

    def walk(msgs: Any, prefix: str) -> None:
        for m in msgs:
            full = f"{prefix}.{m.name}"
            messages[full] = {
                f.name: {
                    "label": LABELS[f.label],
                    "number": f.number,
                    "proto3_optional": f.proto3_optional,
                    "type": _type_name(f.type),
                    "type_name": f.type_name.lstrip("."),
                }
                for f in m.field
            }
            walk(m.nested_type, full)

    walk(fdp.message_type, pkg)
    for e in fdp.enum_type:
        messages[f"{pkg}.{e.name}"] = {"enum": {v.name: v.number for v in e.value}}
    services = {
        f"{pkg}.{s.name}": {
            m.name: {
                "input": m.input_type.lstrip("."),
                "output": m.output_type.lstrip("."),
                "server_streaming": m.server_streaming,
            }
            for m in s.method
        }
        for s in fdp.service
    }
    return {"messages": messages, "package": pkg, "services": services}


@pytest.mark.skipif(not WIRE.exists(), reason="shared/reference not beside the repository")
def test_descriptors_match_kubelet_wire() -> None:
    wire = json.loads(WIRE.read_text())
    ours = {}
    for module in MODULES:
        d = _describe(module)
        ours[d["package"]] = d
    assert sorted(ours) == sorted(wire)
    for pkg, expected in wire.items():
        got = ours[pkg]
        # oneof-synthetic fields of proto3 optional are not in the wire file; compare fields.
        assert got["services"] == expected["services"], pkg
        assert got["messages"] == expected["messages"], pkg


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
