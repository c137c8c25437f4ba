"""The CDI JSON schema, from the copy in ``tests/data/cdi-schema`` (see its README).

One loader for every test that validates a CDI spec. The files are part of the repository,
so a missing file is an error, not a reason to skip.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import referencing
import referencing.jsonschema

from tests.support.paths import TEST_DATA

SCHEMA_DIR = TEST_DATA / "cdi-schema"


def load(relative: str) -> Any:
    """A JSON file of the schema directory, e.g. ``testdata/good/minimal.json``."""
    return json.loads((SCHEMA_DIR / relative).read_text())


def validator() -> jsonschema.Draft7Validator:
    """A draft-07 validator for ``schema.json`` that resolves its ``defs.json#/...`` references."""
    registry = referencing.Registry().with_resource(
        "defs.json",
        referencing.Resource.from_contents(
            load("defs.json"), default_specification=referencing.jsonschema.DRAFT7
        ),
    )
    return jsonschema.Draft7Validator(load("schema.json"), registry=registry)
