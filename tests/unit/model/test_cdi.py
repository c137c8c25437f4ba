"""CDI specs: official schema, minimum version, names, atomic files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.model import cdi
from dra_driver.model.errors import PrepareError
from dra_driver.prepare.cdispecs import CdiSpecs
from tests.support.cdischema import load, validator
from tests.support.fakes import plans

UID = "0b8f6f4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def sample_spec() -> dict[str, Any]:
    edits = cdi.ContainerEdits(
        env=("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "NVIDIA_GPU_MEMORY_LIMIT=1024"),
        device_nodes=tuple(cdi.DeviceNode(p) for p in ("/dev/nvidia0", *cdi.CONTROL_DEVICE_NODES)),
        mounts=(cdi.Mount("/run/gpu-fraction/mps/x", "/tmp/nvidia-mps"),),
        hooks=(cdi.Hook("createRuntime", "/usr/bin/nvidia-cdi-hook", ("nvidia-cdi-hook", "x")),),
    )
    return cdi.build_spec(
        "gpu-fraction.dra.dev", [cdi.CdiDevice(cdi.device_name(UID, "gpu-0-quarter-1"), edits)]
    )


def test_schema_fixtures_behave() -> None:
    v = validator()
    assert not list(v.iter_errors(load("testdata/good/minimal.json")))
    assert list(v.iter_errors(load("testdata/bad/explicit-empty.json")))


def test_claim_spec_validates_and_uses_lowest_version() -> None:
    spec = sample_spec()
    assert not list(validator().iter_errors(spec))
    assert spec["cdiVersion"] == "0.3.0"
    assert spec["kind"] == "gpu-fraction.dra.dev/claim"
    assert spec["devices"][0]["name"] == f"claim-{UID}-gpu-0-quarter-1"


@pytest.mark.parametrize(
    ("mutate", "version"),
    [
        (lambda s: s["devices"][0]["containerEdits"]["mounts"][0].update(type="bind"), "0.4.0"),
        (lambda s: s["devices"][0].update(name="0abc"), "0.5.0"),
        (
            lambda s: s["devices"][0]["containerEdits"]["deviceNodes"][0].update(hostPath="/x"),
            "0.5.0",
        ),
        (lambda s: s.update(annotations={"a": "b"}), "0.6.0"),
        (lambda s: s.update(kind="vendor.com/cl.ass"), "0.6.0"),
        (lambda s: s["devices"][0]["containerEdits"].update(additionalGids=[5]), "0.7.0"),
        (
            lambda s: s["devices"][0]["containerEdits"].update(
                netDevices=[{"hostInterfaceName": "a", "name": "b"}]
            ),
            "1.1.0",
        ),
    ],
)
def test_minimum_version_follows_features(mutate: Any, version: str) -> None:
    spec = sample_spec()
    mutate(spec)
    assert cdi.minimum_version(spec) == version


def test_names_refuse_bad_uids_and_share_ids() -> None:
    with pytest.raises(PrepareError):
        cdi.device_name("../../etc", "gpu-0")
    with pytest.raises(PrepareError):
        CdiSpecs(Path("/tmp"), "v").path("A-B")
    with pytest.raises(cdi.CdiError):
        cdi.device_name(UID, "gpu-0", "bad/share")


@given(st.uuids().map(str), st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True))
def test_every_uid_and_device_gives_a_valid_name(uid: str, device: str) -> None:
    name = cdi.device_name(uid, device)
    assert cdi.qualified_name("gpu-fraction.dra.dev", name).startswith(
        "gpu-fraction.dra.dev/claim="
    )


def test_write_and_remove_are_atomic_and_idempotent(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path, "gpu-fraction.dra.dev", Path("/host"))
    plan = plans.plan(plans.device(plans.gpu(0), 4 * plans.GIB), uid=UID)
    ids = specs.write(plan, {})
    path = specs.path(UID)
    assert path.name == f"gpu-fraction.dra.dev-claim_{UID}.json"
    written = json.loads(path.read_text())
    assert written["kind"] == "gpu-fraction.dra.dev/claim"
    assert set(ids.values()) == {
        f"gpu-fraction.dra.dev/claim={d['name']}" for d in written["devices"]
    }
    assert specs.device_ids(UID) == frozenset(ids.values())
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert specs.claim_uids() == {UID}
    assert specs.remove(UID)
    assert not specs.remove(UID)
    assert specs.device_ids(UID) is None


@pytest.mark.parametrize("share_id", ["a\n", "a b", "a/b"])
def test_device_name_refuses_characters_outside_the_cdi_alphabet(share_id: str) -> None:
    with pytest.raises(cdi.CdiError, match="characters outside"):
        cdi.device_name("3f1c2b9a-0d4e-4c7b-9a51-5e2f8d6c7b10", "gpu-0", share_id)
