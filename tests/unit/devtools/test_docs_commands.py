"""What the docs tell a user to run works from a clone after the quickstart, and the chart asks
for the Kubernetes version the admin guide requires."""

from __future__ import annotations

import re

import yaml

from tests.support.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _commands(text: str) -> list[str]:
    """Lines of fenced code blocks and inline code spans."""
    blocks = [
        line.strip()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
        for line in block.splitlines()
    ]
    return blocks + re.findall(r"`([^`\n]+)`", text)


def test_no_command_runs_the_package_with_the_system_python() -> None:
    """``python -m dra_driver ...`` fails outside the virtualenv (No module named 'structlog'):
    a new user found it in the admin guide and node-config.md."""
    bad = {
        f"{doc.name}: {cmd}"
        for doc in DOCS
        for cmd in _commands(doc.read_text())
        if re.match(r"python3? -m dra_driver\S* ", cmd)
    }
    assert bad == set()


def test_chart_asks_for_the_kubernetes_version_the_admin_guide_requires() -> None:
    """The chart said >=1.34 with feature gates for 1.34/1.35 that the admin guide never
    mentions; the guide requires 1.37 (and the sizing policy needs admissionregistration v1)."""
    chart = yaml.safe_load((REPO / "deployments/helm/gpu-fraction-dra/Chart.yaml").read_text())
    guide = (REPO / "docs" / "admin-guide.md").read_text()
    required = re.search(r"^\| Kubernetes control plane \| (\d+\.\d+) ", guide, flags=re.M)
    assert required is not None
    assert chart["kubeVersion"] == f">={required.group(1)}.0-0"
