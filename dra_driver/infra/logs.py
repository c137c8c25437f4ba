"""structlog set-up: JSON lines (default, for log collectors) or console text."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from dra_driver.model.textlimits import shorten

LEVELS = ("debug", "info", "warning", "error")
MAX_LOG_VALUE_CHARS = 1_000
"""Characters kept of one string in a log line; values come from claims and requests (a
64 KiB claim name must not make every line about it 64 KiB)."""


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return shorten(value, MAX_LOG_VALUE_CHARS)
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _bounded(v) for k, v in value.items()}
    return value


def truncate_long_values(
    logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: cut every string value (also inside lists and dicts) to
    :data:`MAX_LOG_VALUE_CHARS` characters plus ``... (<n> characters)``."""
    return {key: _bounded(value) for key, value in event_dict.items()}


def configure(level: str = "info", fmt: str = "json") -> None:
    """Configure structlog once for the process.

    Args:
        level: one of ``debug``, ``info``, ``warning``, ``error``.
        fmt: ``json`` (one JSON object per line) or ``console``.
    """
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            truncate_long_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
