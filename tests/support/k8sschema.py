"""Kubernetes OpenAPI schema validation with the schemas loaded once per test session.

``kubernetes_validate.validate`` reads and parses the 1.8 MB ``_definitions.json`` and builds a
new validator on every call (20-50 ms each); :func:`validate` checks the same schema, strictness
and version choice (``kubernetes_validate.utils.validate``) but keeps one validator per kind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils
from referencing import Registry, Resource

K8S_VERSION = "1.37.0"


@cache
def _definitions(schema_dir: str) -> Resource[Any]:
    return Resource.from_contents(
        utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", K8S_VERSION)
    )


@cache
def _validator(kind: str, api_version: str, strict: bool) -> jsonschema.Draft202012Validator:
    """The validator ``kubernetes_validate.validate`` would build for this kind.

    Raises ``kubernetes_validate.SchemaNotFoundError`` for a kind the schemas do not know."""
    schema_dir = f"v{K8S_VERSION}-local" + ("-strict" if strict else "")
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group}.json", K8S_VERSION
        )
    except FileNotFoundError:
        raise kubernetes_validate.SchemaNotFoundError(
            version=utils.major_minor(K8S_VERSION), kind=kind, api_version=api_version
        ) from None
    resource = Resource.from_contents(schema)
    registry = _definitions(schema_dir) @ (resource @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(obj: Mapping[str, Any], strict: bool = True) -> None:
    """Validate ``obj`` against the Kubernetes 1.37 schema of its kind.

    Raises ``kubernetes_validate.ValidationError`` (invalid) or ``SchemaNotFoundError``
    (unknown kind), as ``kubernetes_validate.validate`` does."""
    validator = _validator(obj["kind"], obj["apiVersion"], strict)
    try:
        validator.validate(dict(obj))
    except jsonschema.ValidationError as exc:  # the same translation as kubernetes_validate
        raise kubernetes_validate.ValidationError(
            exc, version=utils.major_minor(K8S_VERSION)
        ) from exc
