"""Logging setup for nicfleet-aggregator: the shared formatters of `proto.logs`."""

from __future__ import annotations

from proto.logs import (
    FIELDS,
    FORMATS,
    LEVELS,
    JsonFormatter,
    LogFormat,
    TextFormatter,
    configure_logging,
    resolve_format,
)

__all__ = [
    "FIELDS",
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "LogFormat",
    "TextFormatter",
    "configure_logging",
    "resolve_format",
]
