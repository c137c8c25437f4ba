"""YAML that refuses a key given twice in one mapping (PyYAML keeps the last one silently), for
configuration files a typo must not half-apply."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

from dra_driver.model.errors import DriverError


class DuplicateKeyError(DriverError, yaml.YAMLError):
    """A mapping names one key twice (PyYAML would keep the last silently)."""


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    Keys merged in with ``<<: *anchor`` may be overridden by an explicit key (that is what
    merge keys are for); only explicit keys are compared.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # SafeLoader reports unhashable keys itself
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise DuplicateKeyError(
                    f"line {line}: duplicate key {key!r} (first at line {first_line[key]})"
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def strict_yaml(text: str) -> Any:
    """The YAML document in ``text``, loaded safely (:class:`StrictLoader`).

    Raises:
        DuplicateKeyError: a mapping names one key twice (the message names both lines).
        yaml.YAMLError: not valid YAML.
        ValueError, RecursionError: an integer beyond Python's digit limit, deep nesting.
    """
    return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass
