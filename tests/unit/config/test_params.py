"""Claim parameter validation and merging."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.config.params import (
    PARAMS_API_VERSION,
    PARAMS_KIND,
    ClaimParameters,
    ParameterError,
    parse_parameters,
)


def params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": PARAMS_API_VERSION, "kind": PARAMS_KIND, **fields}


def test_empty_parameters_set_nothing() -> None:
    assert parse_parameters(params()) == ClaimParameters()


def test_absolute_limit_and_mode() -> None:
    p = parse_parameters(
        params(memoryLimit="60Gi", computeMode="sm-sharing", activeThreadPercentage=50)
    )
    assert p.memory_limit_bytes == 60 * 1024**3
    assert p.compute_mode == "sm-sharing"
    assert p.active_thread_percentage == 50


def test_portion_is_exact() -> None:
    assert parse_parameters(params(memoryLimitPortion="0.8")).memory_limit_portion == Fraction(4, 5)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"memoryLimit": "lots"}, "not a Kubernetes quantity"),
        ({"memoryLimit": "-1Gi"}, "greater than zero"),
        ({"memoryLimit": "0.5"}, "whole number of bytes"),
        ({"memoryLimitPortion": "0"}, "outside (0, 1]"),
        ({"memoryLimitPortion": "1.2"}, "outside (0, 1]"),
        ({"memoryLimitPortion": "half"}, "number in (0, 1]"),
        ({"memoryLimitPortion": "5e-1"}, "number in (0, 1]"),
        ({"memoryLimitPortion": "0.5\n"}, "number in (0, 1]"),  # the admission policy refuses it
        ({"memoryLimitPortion": float("inf")}, "outside (0, 1]"),
        ({"memoryLimitPortion": float("nan")}, "outside (0, 1]"),
        ({"memoryLimit": 1.5}, "must be a Kubernetes quantity"),
        ({"memoryLimit": "1Gi", "memoryLimitPortion": "0.5"}, "not both"),
        ({"computeMode": "exclusive"}, "must be one of"),
        ({"activeThreadPercentage": 0}, "1..100"),
        ({"activeThreadPercentage": 101}, "1..100"),
        ({"activeThreadPercentage": True}, "1..100"),
        ({"computeMode": "time-slicing", "activeThreadPercentage": 50}, "only valid with"),
        ({"memorylimit": "1Gi"}, "unknown field(s) memorylimit"),
    ],
)
def test_bad_parameters_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ParameterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_parameters(params(**fields), "claim config #0")


def test_wrong_kind_and_non_object() -> None:
    with pytest.raises(ParameterError, match="apiVersion/kind"):
        parse_parameters({"apiVersion": "v1", "kind": "ConfigMap"})
    with pytest.raises(ParameterError, match="expected an object, got a list"):
        parse_parameters(["memoryLimit"])


def test_later_config_wins_and_limit_forms_replace_each_other() -> None:
    cls = parse_parameters(params(memoryLimit="10Gi", computeMode="sm-sharing"))
    claim = parse_parameters(params(memoryLimitPortion="0.5"))
    merged = cls.merged(claim)
    assert merged.memory_limit_bytes is None
    assert merged.memory_limit_portion == Fraction(1, 2)
    assert merged.compute_mode == "sm-sharing"


@given(st.integers(min_value=1, max_value=2**50))
def test_any_positive_byte_quantity_round_trips(n: int) -> None:
    assert parse_parameters(params(memoryLimit=str(n))).memory_limit_bytes == n
