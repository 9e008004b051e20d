"""Logging setup for nicfleet-agent: the shared formatters of `proto.logs`, plus
`tag_node`, which puts the agent's node on every event."""

from __future__ import annotations

import logging

from proto.logs import (
    FIELDS,
    FORMATS,
    LEVELS,
    JsonFormatter,
    LogFormat,
    TextFormatter,
    _Handler,
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
    "tag_node",
]


class _NodeField(logging.Filter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "node", None) is None:
            record.node = self.node
        return True


def tag_node(node: str) -> None:
    """Every later event carries `node` (an agent serves one node): on our handler."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _Handler):
            handler.addFilter(_NodeField(node))
