"""Install manifests, Helm chart, examples and Dockerfile, checked without a cluster.

- every manifest, example and every object the chart renders passes the Kubernetes 1.37
  OpenAPI schemas (strict: no unknown fields);
- ``helm lint`` passes and ``manifests/*.yaml`` are exactly the chart's default rendering;
- the chart is the one source of the DeviceClasses and sizing policies: ``manifests/deviceclasses``
  is its rendering (``hack/render-deviceclasses``), its class names and slots are those of
  ``dra_driver.config.classnames``, and its node configuration parses with
  ``dra_driver.config.node``; the DaemonSet's arguments parse with the real CLI;
- examples agree with ``dra_driver.config.params`` (valid ones parse, invalid ones are rejected);
- the Dockerfile builds the image with hack/build-image (pinned inputs).

The helm binary comes from ``hack/build-k8s helm`` (built on first use); if it cannot be
built the tests fail rather than skip.

Regenerate the rendered manifests after changing the chart:
``.venv/bin/python -m tests.integration.test_manifests --write``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from devtools import chartrender
from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.app.args import build_parser as _parser
from dra_driver.config import class_slots
from dra_driver.config.classnames import device_class_name
from dra_driver.config.load import load_node_config, parse_node_config_text
from dra_driver.config.node import NodeConfig, default_node_config
from dra_driver.config.params import (
    PARAMS_API_VERSION,
    PARAMS_KIND,
    ParameterError,
    parse_parameters,
)
from dra_driver.model.vocabulary import COMPUTE_MODES
from tests.support import chartobjects, k8sschema
from tests.support.paths import REPO

ROOT = REPO

CHART = ROOT / "deployments" / "helm" / "gpu-fraction-dra"
MANIFESTS = ROOT / "manifests"
EXAMPLES = MANIFESTS / "examples"
INVALID = EXAMPLES / "invalid"
BUILD_K8S = ROOT / "hack" / "build-k8s"
RELEASE = "gpu-fraction-dra"
NAMESPACE = "gpu-fraction-dra"
PLACEHOLDER_IMAGE = "ghcr.io/example/gpu-fraction-dra:0.1.0"

# Chart template -> the plain manifest rendered from it.
RENDERED = {
    "serviceaccount.yaml": "serviceaccount.yaml",
    "rbac.yaml": "rbac.yaml",
    "configmap.yaml": "configmap-node-config.yaml",
    "daemonset.yaml": "daemonset.yaml",
    "policy-node-scoped-slices.yaml": "policy-node-scoped-slices.yaml",
    "policy-claim-parameters.yaml": "policy-claim-parameters.yaml",
    "policy-tenant-namespaces.yaml": "policy-tenant-namespaces.yaml",
    "policy-device-taint-rules.yaml": "policy-device-taint-rules.yaml",
    "networkpolicy.yaml": "networkpolicy-metrics.yaml",
    "mps-service.yaml": "daemonset-mps-service.yaml",
}
# Plain manifests not rendered by the chart (Helm installs into an existing namespace).
HAND_WRITTEN = {"namespace.yaml"}
HEADER = (
    "# Generated from deployments/helm/gpu-fraction-dra with its default values\n"
    f"# (helm template {RELEASE} --namespace {NAMESPACE}); do not edit by hand.\n"
    "# Regenerate: .venv/bin/python -m tests.integration.test_manifests --write\n"
)
VALUE_VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "custom": [
        "--set",
        "driverName=gpu.example.org",
        "--set",
        "gpus=simulated:H200x8",
        "--set",
        "hostCgroupMount=false",
        "--set",
        "hostPID=false",
        "--set",
        "rbac.claimDeviceStatus=true",
        "--set",
        "runtimeClassName=nvidia",
        "--set",
        "image.digest=sha256:" + "a" * 64,
        "--set-json",
        'policies.claimParametersActions=["Warn","Audit"]',
        "--set-json",
        'computeModes=["sm-sharing"]',
        "--set",
        "mps.smSharingComputeMode=DEFAULT",
        "--set",
        "mps.timeSlicingComputeMode=DEFAULT",
    ],
    "off": [
        "--set",
        "deviceClasses.enabled=false",
        "--set",
        "policies.nodeScopedSlices=false",
        "--set",
        "policies.claimParameters=false",
        "--set",
        "policies.deviceTaintRuleSelector=false",
        "--set",
        "tenants.requireGrant=false",
        "--set",
        "metricsNetworkPolicy.enabled=false",
    ],
    "demo": ["-f", str(ROOT / "deployments" / "helm" / "demo-values.yaml")],
    "kai": [
        "--set",
        "kaiCompat.enabled=true",
        "--set-json",
        'tenants.namespaces={"team-a": {"gpu-half": 2}}',
        "--set-json",
        'classLimits={"gpu-half": {"maxMemoryLimitPortion": "0.8"}}',
    ],
}


# --- helpers ----------------------------------------------------------------------------------


@cache
def helm() -> str:
    """Path of the pinned helm binary, built by hack/build-k8s if missing (fails if it can't)."""
    bin_dir = subprocess.run(
        [str(BUILD_K8S), "--print-bin-dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    build = subprocess.run([str(BUILD_K8S), "helm"], capture_output=True, text=True)
    path = Path(bin_dir) / "helm"
    if build.returncode != 0 or not path.is_file():
        pytest.fail(
            f"hack/build-k8s helm failed (exit {build.returncode}); helm is required:\n"
            f"{build.stderr[-3000:]}",
            pytrace=False,
        )
    return str(path)


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([helm(), *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"helm {shlex.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res


@cache
def render(*extra: str) -> str:
    """``helm template`` output of the chart with extra arguments."""
    return run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra).stdout


def split_sources(text: str) -> dict[str, str]:
    """Rendered text per template file (``templates/x.yaml``), documents joined by ``---``."""
    out: dict[str, list[str]] = {}
    for chunk in re.split(r"^---\n", text, flags=re.M):
        m = re.match(r"# Source: [^/]+/templates/(\S+)\n", chunk)
        if not m:
            assert not chunk.strip(), f"unexpected helm output: {chunk[:200]}"
            continue
        body = chunk[m.end() :]
        if body.strip():
            out.setdefault(m.group(1), []).append(body)
    return {k: "---\n".join(v) for k, v in out.items()}


def expected_manifests() -> dict[str, str]:
    """File name -> content of each rendered plain manifest."""
    sources = split_sources(render())
    assert set(RENDERED) <= set(sources), f"chart no longer renders {set(RENDERED) - set(sources)}"
    return {RENDERED[src]: HEADER + sources[src] for src in RENDERED}


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def file_docs(path: Path) -> list[dict[str, Any]]:
    return docs(path.read_text())


def rendered_objects(*extra: str) -> list[dict[str, Any]]:
    return docs(render(*extra))


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def plugin_daemonset(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The kubelet plugin's DaemonSet (the MPS service has one too)."""
    (ds,) = [
        o
        for o in of_kind(objs, "DaemonSet")
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "kubelet-plugin"
    ]
    return ds


def example_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.glob("*.yaml"))


def invalid_files() -> list[Path]:
    return sorted(INVALID.glob("*.yaml"))


def opaque_configs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Our driver's opaque config entries of a ResourceClaim or ResourceClaimTemplate."""
    spec = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
    for entry in spec.get("devices", {}).get("config", []):
        if entry.get("opaque", {}).get("driver") == DEFAULT_DRIVER_NAME:
            yield entry


def expected_message(path: Path) -> str:
    m = re.search(r"^# expect: (.+)$", path.read_text(), flags=re.M)
    assert m, f"{path.name}: no '# expect: <message>' line"
    return m.group(1).strip()


TENANT_EXAMPLE = MANIFESTS / "tenants" / "team-a.yaml"
TENANT_VALUES = [
    "--set-json",
    'tenants.namespaces={"team-a":{"gpu-eighth":4,"gpu-quarter-sm-sharing":1}}',
]
TENANT_HEADER = (
    "# A tenant namespace for a plain install: the chart's rendering of\n"
    "#   tenants: {namespaces: {team-a: {gpu-eighth: 4, gpu-quarter-sm-sharing: 1}},\n"
    "#             createNamespaces: true}\n"
    "# Copy it per team and change the grants; every DeviceClass of the driver stays listed (at\n"
    '# 0 unless granted). docs/admin-guide.md, "Tenants".\n'
    "# Regenerate: .venv/bin/python -m tests.integration.test_manifests --write\n"
)


def expected_tenant_example() -> str:
    """The chart's rendering of one tenant namespace (Namespace and ResourceQuota)."""
    text = render(*TENANT_VALUES, "--set", "tenants.createNamespaces=true")
    return TENANT_HEADER + split_sources(text)["tenants.yaml"]


def write_manifests() -> None:
    for name, text in expected_manifests().items():
        (MANIFESTS / name).write_text(text)
        print(f"wrote {MANIFESTS / name}")
    TENANT_EXAMPLE.parent.mkdir(exist_ok=True)
    TENANT_EXAMPLE.write_text(expected_tenant_example())
    print(f"wrote {TENANT_EXAMPLE}")


# --- helm -------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(VALUE_VARIANTS))
def test_helm_lint(variant: str) -> None:
    res = run_helm(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *VALUE_VARIANTS[variant]
    )
    assert "0 chart(s) failed" in res.stdout


def test_plain_manifests_are_the_default_rendering() -> None:
    expected = expected_manifests()
    for name, text in expected.items():
        path = MANIFESTS / name
        assert path.exists(), (
            f"{path} missing; run: .venv/bin/python -m tests.integration.test_manifests --write"
        )
        assert path.read_text() == text, (
            f"{path} differs from the chart's default rendering; "
            "run: .venv/bin/python -m tests.integration.test_manifests --write"
        )
    present = {p.name for p in MANIFESTS.glob("*.yaml")}
    assert present == set(expected) | HAND_WRITTEN


def test_tenant_example_is_the_charts_rendering() -> None:
    assert TENANT_EXAMPLE.read_text() == expected_tenant_example(), (
        "run: .venv/bin/python -m tests.integration.test_manifests --write"
    )
    kinds = [d["kind"] for d in file_docs(TENANT_EXAMPLE)]
    assert kinds == ["Namespace", "ResourceQuota"]


def test_default_rendering_kinds_and_names() -> None:
    objs = rendered_objects()
    names = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] != "DeviceClass"}
    plugin = f"{RELEASE}-kubelet-plugin"
    assert names == {
        ("ServiceAccount", plugin),
        ("ClusterRole", plugin),
        ("ClusterRoleBinding", plugin),
        ("ConfigMap", f"{RELEASE}-node-config"),
        ("DaemonSet", plugin),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-node-scoped-slices"),
        ("ValidatingAdmissionPolicyBinding", f"{RELEASE}-node-scoped-slices"),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-claim-parameters"),
        ("ValidatingAdmissionPolicyBinding", f"{RELEASE}-claim-parameters"),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-tenant-namespaces"),
        ("ValidatingAdmissionPolicyBinding", f"{RELEASE}-tenant-namespaces"),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-tenant-quota"),
        (
            "ValidatingAdmissionPolicyBinding",
            f"{RELEASE}-tenant-quota.requires.resourcequota.{RELEASE}-gpu-fractions",
        ),
        ("ValidatingAdmissionPolicy", f"{RELEASE}-device-taint-rules"),
        ("ValidatingAdmissionPolicyBinding", f"{RELEASE}-device-taint-rules"),
        ("MutatingAdmissionPolicy", "gpu-fraction-dra-dev-product-sizes"),
        ("MutatingAdmissionPolicyBinding", "gpu-fraction-dra-dev-product-sizes"),
        ("ValidatingAdmissionPolicy", "gpu-fraction-dra-dev-product-sizes"),
        ("ValidatingAdmissionPolicyBinding", "gpu-fraction-dra-dev-product-sizes"),
        ("NetworkPolicy", f"{plugin}-metrics"),
        ("DaemonSet", f"{RELEASE}-mps"),
    }
    for o in objs:
        if o["kind"] in {"ServiceAccount", "ConfigMap", "DaemonSet"}:
            assert o["metadata"]["namespace"] == NAMESPACE
    ns = one(file_docs(MANIFESTS / "namespace.yaml"), "Namespace")
    assert ns["metadata"]["name"] == NAMESPACE
    # The plugin is privileged: Pod Security must admit it in its namespace.
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_toggles_remove_objects() -> None:
    kinds = {o["kind"] for o in rendered_objects(*VALUE_VARIANTS["off"])}
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set-json", 'fractionModels=["products","mig"]'], 'unknown model "mig"'),
        (["--set-json", 'computeModes=["mps"]'], 'unknown mode "mps"'),
        (
            ["--set-json", 'fractionModels=["capacity"]'],
            'nodeConfig.defaults.fractionModel "products" is not in fractionModels',
        ),
        (["--set", "metricsPort=-1"], "metricsPort must be >= 0"),
        (
            ["--set", "tenants.requireLabel=true"],
            "tenants.requireLabel is now tenants.requireGrant",
        ),
        (
            ["--set", "tenants.podSecurity=privileged"],
            'tenants.podSecurity: "privileged" would not be granted',
        ),
        (
            ["--set", "mps.smSharingComputeMode=EXCLUSIVE"],
            'mps.smSharingComputeMode: unknown NVML compute mode "EXCLUSIVE"',
        ),
        (
            ["--set", "mps.timeSlicingComputeMode=default"],
            'mps.timeSlicingComputeMode: unknown NVML compute mode "default"',
        ),
    ],
)
def test_chart_rejects_bad_values(args: list[str], message: str) -> None:
    res = run_helm("template", RELEASE, str(CHART), *args, check=False)
    assert res.returncode != 0
    assert message in res.stderr


# --- schema validation ------------------------------------------------------------------------


def all_objects() -> Iterator[tuple[str, dict[str, Any]]]:
    # demo/ holds manifests only (`kubectl apply -f demo/`), so every file there is checked
    for path in [*sorted(MANIFESTS.rglob("*.yaml")), *sorted((ROOT / "demo").iterdir())]:
        for i, obj in enumerate(file_docs(path)):
            yield f"{path.relative_to(ROOT)}#{i}", obj
    for variant, args in VALUE_VARIANTS.items():
        for i, obj in enumerate(rendered_objects(*args)):
            yield f"helm template ({variant})#{i} {obj['kind']}/{obj['metadata']['name']}", obj


def test_every_object_passes_the_1_37_schema() -> None:
    seen = 0
    errors = []
    for where, obj in all_objects():
        seen += 1
        try:
            k8sschema.validate(obj)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {exc.message} at {list(exc.path)}")
    assert not errors, "\n".join(errors)
    assert seen > 50


# kubectl apply -f DIR reads these extensions (k8s.io/cli-runtime resource.FileExtensions).
KUBECTL_EXTENSIONS = (".json", ".yaml", ".yml")


def kubectl_files(directory: Path, recursive: bool) -> list[Path]:
    """The files ``kubectl apply -f DIR`` (``-R``: and its subdirectories) reads."""
    found = directory.rglob("*") if recursive else directory.glob("*")
    return sorted(p for p in found if p.is_file() and p.suffix in KUBECTL_EXTENSIONS)


@pytest.mark.parametrize("recursive", [False, True], ids=["apply -f", "apply -R -f"])
def test_kubectl_apply_on_manifests_dir_reads_only_kubernetes_objects(recursive: bool) -> None:
    """``kubectl apply [-R] -f manifests/`` finds nothing but Kubernetes objects."""
    errors = []
    files = kubectl_files(MANIFESTS, recursive)
    for path in files:
        for i, obj in enumerate(file_docs(path)):
            where = f"{path.relative_to(ROOT)}#{i}"
            if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
                errors.append(f"{where}: not a Kubernetes object (no apiVersion/kind)")
                continue
            try:
                k8sschema.validate(obj)
            except kubernetes_validate.SchemaNotFoundError:
                kind = f"{obj['kind']} {obj['apiVersion']}"
                errors.append(f"{where}: {kind} is not a Kubernetes API type (kubectl fails)")
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{where}: {exc.message} at {list(exc.path)}")
    assert not errors, "\n".join(errors)
    assert {p.name for p in files} >= set(RENDERED.values()) | HAND_WRITTEN


# --- chart vs. the driver's own code ----------------------------------------------------------


def canonical(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs}


def shipped_deviceclass_dir() -> list[dict[str, Any]]:
    """Every object in ``manifests/deviceclasses/`` (classes and the sizing policy)."""
    return [d for p in sorted((MANIFESTS / "deviceclasses").glob("*.yaml")) for d in file_docs(p)]


def class_names(
    config: NodeConfig, modes: tuple[str, ...] = COMPUTE_MODES, capacity: bool = True
) -> set[str]:
    """The class names the Python side (slices, occupancy) expects for ``config``'s products in
    ``modes``, and the capacity classes."""
    names = {device_class_name(p.name, m) for p in config.all_products() for m in modes}
    return names | ({device_class_name(None, m) for m in modes} if capacity else set())


def test_shipped_deviceclasses_are_the_charts_rendering() -> None:
    """The chart is the one source of the classes and sizing policies; the plain manifests are
    its rendering (``hack/render-deviceclasses``), named as the Python side names them."""
    assert chartrender.main(["--check", str(MANIFESTS / "deviceclasses")]) == 0
    chart = canonical(of_kind(rendered_objects(), "DeviceClass"))
    assert chart == canonical(of_kind(shipped_deviceclass_dir(), "DeviceClass"))
    assert set(chart) == class_names(default_node_config())


def test_the_unit_tests_chart_classes_are_fresh() -> None:
    """``tests/data/deviceclasses-extended.yaml`` is what the chart renders now."""
    assert chartobjects.EXTENDED.read_text() == chartobjects.render_extended()


@pytest.mark.parametrize("variant", ["defaults", "extended"])
def test_the_sizing_policy_writes_each_class_its_products_slots(variant: str) -> None:
    """The mutating policy's table of slots is ``portion * slotsPerGpu`` per product class
    (:func:`dra_driver.config.class_slots`), in both policies; with extended resources the
    validating one lets the scheduler create claims of exactly those classes."""
    extended = variant == "extended"
    args = ["--set", "extendedResources.enabled=true"] if extended else []
    objs = rendered_objects(*args)
    want = class_slots(NodeConfig(extended_resources=extended))
    for kind in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy"):
        (sizing,) = [o for o in of_kind(objs, kind) if "product-sizes" in o["metadata"]["name"]]
        (table,) = [v["expression"] for v in sizing["spec"]["variables"] if v["name"] == "slots"]
        assert json.loads(table) == want


def configmap_config(objs: list[dict[str, Any]]) -> str:
    text: str = one(objs, "ConfigMap")["data"]["node-config.yaml"]
    return text


def test_default_node_config_is_the_plugin_default() -> None:
    assert parse_node_config_text(configmap_config(rendered_objects())) == default_node_config()


def test_node_config_example_through_chart_values(tmp_path: Path) -> None:
    """docs' node configuration example, given as chart values, renders to the same
    configuration and to DeviceClasses for every product it names (incl. per-GPU ones)."""
    example_path = ROOT / "docs" / "examples" / "node-config.example.yaml"
    example = yaml.safe_load(example_path.read_text())
    values = {
        "driverName": "gpu.example.org",
        "products": example.pop("products"),
        "nodeConfig": {k: v for k, v in example.items() if k not in ("apiVersion", "kind")},
        "fractionModels": ["products", "capacity"],
        "computeModes": ["time-slicing"],
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    objs = rendered_objects("-f", str(values_file))
    config = parse_node_config_text(configmap_config(objs))
    assert config == load_node_config(str(example_path))
    classes = canonical(of_kind(objs, "DeviceClass"))
    assert set(classes) == class_names(config, ("time-slicing",))
    assert "gpu-sixteenth" in classes
    rendered = chartrender.device_classes(
        config=example | {"products": values["products"]},
        driver="gpu.example.org",
        compute_modes=["time-slicing"],
    )
    assert canonical(rendered) == classes, "chartrender maps a node configuration to these values"


def test_deviceclasses_follow_enabled_models() -> None:
    objs = rendered_objects("--set-json", 'fractionModels=["products"]')
    classes = canonical(of_kind(objs, "DeviceClass"))
    assert set(classes) == class_names(default_node_config(), capacity=False)
    objs = rendered_objects(
        "--set-json",
        'fractionModels=["capacity"]',
        "--set",
        "nodeConfig.defaults.fractionModel=capacity",
    )
    assert sorted(canonical(of_kind(objs, "DeviceClass"))) == [
        "gpu-memory",
        "gpu-memory-sm-sharing",
    ]


# --- DaemonSet --------------------------------------------------------------------------------


def plugin_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = plugin_daemonset(objs)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    c: dict[str, Any] = container
    return c


def test_daemonset_arguments_parse_with_the_cli() -> None:
    objs = rendered_objects()
    c = plugin_container(objs)
    assert c["image"] == PLACEHOLDER_IMAGE
    assert c["command"] == ["dra-driver", "kubelet-plugin"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    argv = [a.replace("$(NODE_NAME)", "node-a").replace("$(POD_UID)", "uid-1") for a in c["args"]]
    args = _parser().parse_args([c["command"][1], *argv])
    assert args.driver == DEFAULT_DRIVER_NAME
    assert (args.node_name, args.rolling_update_uid) == ("node-a", "uid-1")
    assert args.gpus == "nvml"
    assert args.metrics_port == 8080
    assert (args.log_level, args.log_format) == ("info", "json")
    assert args.sm_sharing_compute_mode == "EXCLUSIVE_PROCESS"
    assert args.time_slicing_compute_mode == "EXCLUSIVE_PROCESS"
    assert args.claim_device_status is True
    off = plugin_container(rendered_objects("--set", "rbac.claimDeviceStatus=false"))["args"]
    assert _parser().parse_args(["kubelet-plugin", *off]).claim_device_status is False
    # Every path the plugin uses is a mounted volume.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in plugin_daemonset(objs)["spec"]["template"]["spec"]["volumes"]}

    def host_path(path: str) -> str:
        v = volumes[mounts[path]]
        p: str = v["hostPath"]["path"]
        return p

    plugin_dir = f"{args.plugin_dir}/{args.driver}"
    # The kubelet dials the socket path the plugin reports: same path on both sides.
    for path in (plugin_dir, args.registry_dir, args.cdi_root, args.state_dir):
        assert host_path(path) == path
    assert host_path("/run/gpu-fraction") == "/run/gpu-fraction"
    assert host_path("/sys/fs/cgroup") == "/sys/fs/cgroup"
    assert args.registry_dir == "/var/lib/kubelet/plugins_registry"
    assert (args.cdi_root, args.state_dir) == ("/var/run/cdi", "/var/lib/gpu-fraction-dra")
    config_dir = str(Path(args.node_config).parent)
    assert volumes[mounts[config_dir]]["configMap"]["name"] == f"{RELEASE}-node-config"
    assert Path(args.node_config).name == "node-config.yaml"


def test_local_cluster_values_render_host_network_env_and_no_probes() -> None:
    """The values the local test cluster installs with (devtools/localinstall.py): the node's
    network, extra env for the API server address, no metrics port and no probes."""
    objs = rendered_objects(
        "--set", "hostNetwork=true", "--set", "metricsPort=0",
        "--set", "extraEnv[0].name=KUBERNETES_SERVICE_HOST",
        "--set", "extraEnv[0].value=127.0.0.1",
    )  # fmt: skip
    pod = plugin_daemonset(objs)["spec"]["template"]["spec"]
    c = plugin_container(objs)
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"} in c["env"]
    assert "--metrics-port=0" in c["args"]
    assert not {"ports", "startupProbe", "livenessProbe", "readinessProbe"} & set(c)


def test_daemonset_privileges_probes_and_rollout() -> None:
    objs = rendered_objects()
    ds = plugin_daemonset(objs)
    pod = ds["spec"]["template"]["spec"]
    c = plugin_container(objs)
    assert pod["hostPID"] is True
    assert "hostNetwork" not in pod and "hostIPC" not in pod
    assert c["securityContext"] == {
        "privileged": True,
        "runAsUser": 0,
        "runAsGroup": 0,
        "readOnlyRootFilesystem": True,
    }
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (port,) = c["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 8080)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert "cpu" not in c["resources"]["limits"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["serviceAccountName"] == f"{RELEASE}-kubelet-plugin"
    # A node-config change rolls the plugins.
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    other = plugin_daemonset(
        rendered_objects("--set", "nodeConfig.defaults.computeMode=sm-sharing")
    )
    assert (
        other["spec"]["template"]["metadata"]["annotations"]["checksum/node-config"]
        != annotations["checksum/node-config"]
    )


def test_custom_values_reach_the_daemonset() -> None:
    objs = rendered_objects(*VALUE_VARIANTS["custom"])
    pod = plugin_daemonset(objs)["spec"]["template"]["spec"]
    c = plugin_container(objs)
    argv = [a.replace("$(NODE_NAME)", "n").replace("$(POD_UID)", "u") for a in c["args"]]
    args = _parser().parse_args(["kubelet-plugin", *argv])
    assert (args.driver, args.gpus) == ("gpu.example.org", "simulated:H200x8")
    assert args.sm_sharing_compute_mode == "DEFAULT"
    assert args.time_slicing_compute_mode == "DEFAULT"
    assert c["image"] == "ghcr.io/example/gpu-fraction-dra@sha256:" + "a" * 64
    assert pod["hostPID"] is False and pod["runtimeClassName"] == "nvidia"
    assert "/sys/fs/cgroup" not in {m["mountPath"] for m in c["volumeMounts"]}
    assert f"/var/lib/kubelet/plugins/{args.driver}" in {m["mountPath"] for m in c["volumeMounts"]}


# --- RBAC and policies ------------------------------------------------------------------------


def rules(objs: list[dict[str, Any]]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in one(objs, "ClusterRole")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_cluster_role_is_least_privilege() -> None:
    writes = ("create", "update", "patch", "delete")
    expected = {
        ("resource.k8s.io", "resourceslices", v, ()) for v in ("get", "list", "watch", *writes)
    }
    expected |= {("resource.k8s.io", "resourceclaims", "get", ()), ("", "nodes", "get", ())}
    # Events: create only (Warning events on a claim's pods, e.g. MpsServerRestarted).
    expected |= {("", "events", "create", ())}
    assert rules(rendered_objects("--set", "rbac.claimDeviceStatus=false")) == expected
    # Default: claim device status, written by an update of the status, own node only.
    assert rules(rendered_objects()) - expected == {
        ("resource.k8s.io", "resourceclaims/status", "update", ()),
        (
            "resource.k8s.io",
            "resourceclaims/driver",
            "associated-node:update",
            (DEFAULT_DRIVER_NAME,),
        ),
    }
    binding = one(rendered_objects(), "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-kubelet-plugin", "namespace": NAMESPACE}
    ]


def policy(objs: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    (p,) = [
        o
        for o in of_kind(objs, "ValidatingAdmissionPolicy")
        if o["metadata"]["name"].endswith(suffix)
    ]
    return p


def test_node_scoped_policy_targets_the_plugin_identity() -> None:
    objs = rendered_objects()
    p = policy(objs, "node-scoped-slices")["spec"]
    (cond,) = p["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{RELEASE}-kubelet-plugin"' in cond["expression"]
    text = yaml.safe_dump(p)
    assert "authentication.kubernetes.io/node-name" in text
    assert "oldObject" in text
    assert p["matchConstraints"]["resourceRules"][0]["resources"] == ["resourceslices"]
    assert set(p["matchConstraints"]["resourceRules"][0]["operations"]) == {
        "CREATE",
        "UPDATE",
        "DELETE",
    }
    for b in of_kind(objs, "ValidatingAdmissionPolicyBinding"):
        assert b["spec"]["validationActions"] == ["Deny"]
        # named after its policy; a binding with a parameter also names the one it requires
        # (where it is missing the API server's refusal names only the policy and the binding)
        ref = b["spec"].get("paramRef")
        named = f".requires.resourcequota.{ref['name']}" if ref else ""
        assert b["metadata"]["name"] == b["spec"]["policyName"] + named
    custom = rendered_objects(*VALUE_VARIANTS["custom"])
    assert '"gpu.example.org"' in yaml.safe_dump(policy(custom, "node-scoped-slices"))
    assert '"gpu.example.org"' in yaml.safe_dump(policy(custom, "claim-parameters"))
    (b,) = [
        b
        for b in of_kind(custom, "ValidatingAdmissionPolicyBinding")
        if b["metadata"]["name"].endswith("claim-parameters")
    ]
    assert b["spec"]["validationActions"] == ["Warn", "Audit"]


def test_claim_parameter_policy_reports_every_problem_at_once() -> None:
    """One validation over the list of every config entry's problems (the API server reports
    only the first failing validation: a claim with two mistakes showed one)."""
    p = policy(rendered_objects(), "claim-parameters")["spec"]
    assert p["matchConstraints"]["resourceRules"][0]["resources"] == [
        "resourceclaims",
        "resourceclaimtemplates",
    ]
    (v,) = p["validations"]
    assert v["expression"] == "variables.problems.size() == 0"
    assert v["messageExpression"] == 'variables.problems.join("; ")'
    assert v["message"] and v["reason"] == "Invalid"
    problems = next(x["expression"] for x in p["variables"] if x["name"] == "problems")
    assert problems.count("variables.configs.") == 12  # one list per rule, caps included
    assert "isQuantity(" in yaml.safe_dump(p) and "quantity(" in yaml.safe_dump(p)


def test_plugin_mounts_only_the_host_paths_it_reads() -> None:
    """Not the host's / (every pod's token, the kubelet's credentials): the review found it
    mounted at /host."""
    ds = plugin_daemonset(rendered_objects())
    paths = {
        v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    }
    assert "/" not in paths
    assert paths == {
        "/var/lib/kubelet/plugins/gpu-fraction.dra.dev",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/gpu-fraction-dra",
        "/run/gpu-fraction",
        "/sys/fs/cgroup",
        "/dev",
        "/usr/bin",
    }
    (plugin,) = ds["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in plugin["volumeMounts"]}
    for path in ("/host/dev", "/host/sys/fs/cgroup", "/host/usr/bin"):
        assert mounts[path]["readOnly"] is True
    assert "--host-root=/host" in plugin["args"]


def test_mps_service_daemonset_outlives_plugin_upgrades() -> None:
    """The MPS daemons run in their own DaemonSet, replaced only when an admin deletes a pod
    (a chart upgrade must not end every tenant's MPS server); its pods are not the plugin's."""
    objs = rendered_objects()
    plugin = plugin_daemonset(objs)
    (mps,) = [o for o in of_kind(objs, "DaemonSet") if o["metadata"]["name"].endswith("-mps")]
    assert mps["spec"]["updateStrategy"] == {"type": "OnDelete"}
    mine, theirs = mps["spec"]["selector"]["matchLabels"], plugin["spec"]["selector"]["matchLabels"]
    assert mine != theirs
    for ds, other in ((mps, theirs), (plugin, mine)):  # no selector matches the other's pods
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert not all(labels.get(k) == v for k, v in other.items())
    pod = mps["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["command"] == ["dra-driver", "mps-service"]
    args = _parser().parse_args(
        ["mps-service", *[a.replace("$(NODE_NAME)", "n") for a in container["args"]]]
    )
    assert args.mps_root == "/run/gpu-fraction" and args.node_name == "n"
    (run_dir,) = [v for v in pod["volumes"] if v["name"] == "run-dir"]
    assert run_dir["hostPath"]["path"] == args.mps_root
    assert "--mps-service=separate" in plugin["spec"]["template"]["spec"]["containers"][0]["args"]
    inplugin = rendered_objects("--set", "mps.service=in-plugin")
    assert [o["metadata"]["name"] for o in of_kind(inplugin, "DaemonSet")] == [
        f"{RELEASE}-kubelet-plugin"
    ]
    assert (
        "--mps-service=in-plugin"
        in plugin_daemonset(inplugin)["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    res = run_helm("template", RELEASE, str(CHART), "--set", "mps.service=daemon", check=False)
    assert (
        res.returncode != 0
        and 'mps.service: "daemon" is neither separate nor in-plugin' in res.stderr
    )


def test_metrics_network_policy_selects_the_plugin_and_its_port() -> None:
    objs = rendered_objects()
    policy_ = one(objs, "NetworkPolicy")
    ds = plugin_daemonset(objs)
    assert policy_["spec"]["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    (rule,) = policy_["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"]  # never an empty (allow-all) list
    for args in (["--set", "metricsPort=0"], ["--set", "hostNetwork=true"]):
        assert not of_kind(rendered_objects(*args), "NetworkPolicy")


def test_class_limits_reach_the_classes_and_the_policy() -> None:
    limits = {
        "gpu-half": {"maxMemoryLimitPortion": "1"},
        "gpu-memory": {"maxMemoryLimit": "40Gi", "maxActiveThreadPercentage": 50},
    }
    objs = rendered_objects("--set-json", f"classLimits={json.dumps(limits)}")
    classes = canonical(of_kind(objs, "DeviceClass"))
    for name, caps in limits.items():
        (config,) = classes[name]["spec"]["config"]
        parameters = config["opaque"]["parameters"]
        assert parameters == {"apiVersion": PARAMS_API_VERSION, "kind": PARAMS_KIND, **caps}
    assert "config" not in classes["gpu-quarter"]["spec"]
    variables = {
        x["name"]: x["expression"] for x in policy(objs, "claim-parameters")["spec"]["variables"]
    }
    assert '"gpu-half": double("1")' in variables["portionCaps"]
    assert '"gpu-eighth": 1.0 / 8.0' in variables["portionCaps"]  # no cap: its own size
    assert variables["byteCaps"] == '{"gpu-memory": "40Gi"}'
    assert variables["threadCaps"] == '{"gpu-memory": 50}'
    assert variables["noBurst"] == '["gpu-memory-sm-sharing"]'


def test_tenant_quotas_list_every_class_at_zero_unless_granted() -> None:
    grants = {"team-a": {"gpu-eighth": 2}, "team-b": {}}
    objs = rendered_objects(
        "--set-json",
        f"tenants.namespaces={json.dumps(grants)}",
        "--set",
        "tenants.createNamespaces=true",
    )
    classes = class_names(default_node_config())
    quotas = {q["metadata"]["namespace"]: q["spec"]["hard"] for q in of_kind(objs, "ResourceQuota")}
    assert set(quotas) == {"team-a", "team-b"}
    for ns, hard in quotas.items():
        assert set(hard) == {f"{c}.deviceclass.resource.k8s.io/devices" for c in classes}
        granted = {k for k, v in hard.items() if v != "0"}
        assert granted == {f"{c}.deviceclass.resource.k8s.io/devices" for c in grants[ns]}
    namespaces = {
        n["metadata"]["name"]: n["metadata"]["labels"] for n in of_kind(objs, "Namespace")
    }
    for labels in namespaces.values():
        assert labels[f"{DEFAULT_DRIVER_NAME}/tenant"] == "true"
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    res = run_helm(
        "template",
        RELEASE,
        str(CHART),
        "--set-json",
        'tenants.namespaces={"a":{"gpu-quater":1}}',
        check=False,
    )
    assert res.returncode != 0 and '"gpu-quater" is not a DeviceClass of this chart' in res.stderr


def test_the_charts_tenant_quota_is_the_one_its_policy_requires() -> None:
    """The grant the chart renders passes its own tenant-quota policy: the binding asks for the
    quota by the name the chart gives it, and the policy requires exactly the classes the
    quota lists (those of the chart and tenants.extraClasses)."""
    objs = rendered_objects(
        "--set-json",
        'tenants.namespaces={"team-a":{"gpu-eighth":1}}',
        "--set-json",
        'tenants.extraClasses=["gpu-quarter-hard"]',
    )
    (quota,) = of_kind(objs, "ResourceQuota")
    (binding,) = [
        b for b in of_kind(objs, "ValidatingAdmissionPolicyBinding") if "paramRef" in b["spec"]
    ]
    assert binding["spec"]["paramRef"] == {
        "name": quota["metadata"]["name"],
        "parameterNotFoundAction": "Deny",
    }
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {f"{DEFAULT_DRIVER_NAME}/tenant": "true"}
    }
    required = policy(objs, "tenant-quota")["spec"]["variables"][0]["expression"]
    listed = json.loads(required[: required.index("]") + 1])
    assert [f"{c}.deviceclass.resource.k8s.io/devices" for c in listed] == list(
        quota["spec"]["hard"]
    )
    assert "gpu-quarter-hard" in listed


# --- examples ---------------------------------------------------------------------------------


def test_examples_use_existing_classes_and_valid_parameters() -> None:
    classes = class_names(default_node_config())
    for path in example_files():
        objs = file_docs(path)
        classes |= {o["metadata"]["name"] for o in of_kind(objs, "DeviceClass")}
    templates = 0
    for path in example_files():
        objs = file_docs(path)
        names = {o["metadata"]["name"] for o in of_kind(objs, "ResourceClaimTemplate")}
        for t in of_kind(objs, "ResourceClaimTemplate"):
            templates += 1
            for req in t["spec"]["spec"]["devices"]["requests"]:
                assert req["exactly"]["deviceClassName"] in classes, f"{path.name}: {req}"
            for entry in opaque_configs(t):
                parse_parameters(entry["opaque"]["parameters"], path.name)
        # Every workload refers to a template of its own file.
        for o in objs:
            if o["kind"] in {"Deployment", "Job", "Pod"}:
                pod = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
                refs = {rc["resourceClaimTemplateName"] for rc in pod["resourceClaims"]}
                assert refs <= names, f"{path.name}: {refs - names}"
                claims = {rc["name"] for rc in pod["resourceClaims"]}
                for ctr in pod["containers"]:
                    assert {c["name"] for c in ctr["resources"]["claims"]} <= claims
    assert templates >= 5


def test_example_scenarios() -> None:
    by_name = {p.stem: file_docs(p) for p in example_files()}
    template = one(by_name["capacity-40gi-on-4-gpus-sm-sharing"], "ResourceClaimTemplate")
    cap = template["spec"]["spec"]
    (req,) = cap["devices"]["requests"]
    assert req["exactly"]["count"] == 4
    assert req["exactly"]["capacity"]["requests"]["memory"] == "40Gi"
    assert cap["devices"]["constraints"][0]["distinctAttribute"] == "gpu-fraction.dra.dev/uuid"
    params = cap["devices"]["config"][0]["opaque"]["parameters"]
    # no ceiling above the request: that needs an admin's cap (classLimits)
    assert "memoryLimit" not in params and params["computeMode"] == "sm-sharing"
    quota = one(by_name["quota-four-quarters"], "ResourceQuota")
    assert quota["spec"]["hard"]["gpu-quarter.deviceclass.resource.k8s.io/devices"] == "4"
    hard = one(by_name["deviceclass-hard-enforcement"], "DeviceClass")
    expr = hard["spec"]["selectors"][0]["cel"]["expression"]
    assert '.memoryEnforcement == "hard"' in expr


# A claim served on several GPUs gets one MPS server: its GPUs need one compute mode, one
# enforcement tier and equal memory limits (docs/user-guide.md, "Several GPUs in one claim").
SAME_ON_EVERY_GPU = {
    f"{DEFAULT_DRIVER_NAME}/{name}" for name in ("productName", "gpuMemory", "memoryEnforcement")
}


def test_multi_gpu_examples_keep_their_gpus_alike() -> None:
    """Every example request for several devices constrains them to GPUs of one product,
    memory size and tier (the class fixes the compute mode), so portion-based limits are
    equal and the MPS enforcer does not refuse the claim."""
    checked = 0
    for path in example_files():
        for t in of_kind(file_docs(path), "ResourceClaimTemplate"):
            devices = t["spec"]["spec"]["devices"]
            for req in devices["requests"]:
                if req["exactly"].get("count", 1) < 2:
                    continue
                checked += 1
                matched = {
                    c["matchAttribute"]
                    for c in devices.get("constraints", [])
                    if "matchAttribute" in c and req["name"] in c.get("requests", [req["name"]])
                }
                missing = SAME_ON_EVERY_GPU - matched
                assert not missing, f"{path.name}: request {req['name']} lacks {missing}"
    assert checked >= 2


@pytest.mark.parametrize("path", invalid_files(), ids=lambda p: p.stem)
def test_invalid_examples_are_rejected_by_the_plugin_too(path: Path) -> None:
    """Each invalid example breaks one rule; the plugin's parser agrees, except for the limit
    below the request, which only Prepare can see (it needs the allocation)."""
    assert expected_message(path)
    (obj,) = file_docs(path)
    (entry,) = opaque_configs(obj)
    if path.stem == "limit-below-request":
        parse_parameters(entry["opaque"]["parameters"])
        return
    with pytest.raises(ParameterError):
        parse_parameters(entry["opaque"]["parameters"])


def test_there_are_invalid_examples_for_every_rule() -> None:
    assert len(invalid_files()) >= 10
    kinds = {file_docs(p)[0]["kind"] for p in invalid_files()}
    assert kinds == {"ResourceClaim", "ResourceClaimTemplate"}


# --- docs -------------------------------------------------------------------------------------


def test_every_kubelet_plugin_flag_is_documented() -> None:
    """docs/admin-guide.md, "Plugin flags", names every flag of ``dra-driver kubelet-plugin``."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = [
        option
        for action in sub.choices["kubelet-plugin"]._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    text = (ROOT / "docs" / "admin-guide.md").read_text()
    assert "\n## Plugin flags\n" in text
    section = text.split("\n## Plugin flags\n", 1)[1].split("\n## ", 1)[0]
    missing = [f for f in flags if f"`{f}" not in section]
    assert not missing, f"docs/admin-guide.md, Plugin flags, lacks {missing}"
    assert "--sm-sharing-compute-mode" in flags


# --- Dockerfile -------------------------------------------------------------------------------


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_dockerfile_builds_with_hack_build_image() -> None:
    """The Dockerfile makes the image of ``make image``: its build stage only runs
    ``hack/build-image --rootfs-only`` (every input pinned there; tests/unit/devtools/test_image.py
    checks the pins and that the image configuration matches), the final stage is that tree."""
    text = dockerfile()
    assert "latest" not in text.lower()
    assert "PLACEHOLDER" not in text
    froms = re.findall(r"^FROM\s+(.+)$", text, flags=re.M)
    assert froms == [
        "--platform=linux/amd64 docker.io/library/debian:bookworm AS build",
        "scratch",
    ], froms
    assert re.search(r"^RUN python3 hack/build-image --rootfs-only /out$", text, flags=re.M)
    assert re.search(r"^COPY --from=build /out /$", text, flags=re.M)
    final = text.split("FROM scratch", 1)[1]
    assert not re.search(r"^RUN ", final, flags=re.M), "nothing runs in the final stage"
    assert re.search(r"^USER 0:0$", text, flags=re.M), "run as root explicitly (justified)"
    assert re.search(r'^ENTRYPOINT \["dra-driver"\]$', text, flags=re.M)


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include"
    assert {
        "!pyproject.toml",
        "!requirements-image.txt",
        "!hack/build-image",
        "!devtools/buildimage",
        "!devtools/image-packages.txt",
        "!dra_driver",
    } <= set(lines)
    assert "**/__pycache__" in lines


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_manifests()
    else:
        print(__doc__)
        raise SystemExit(2)
