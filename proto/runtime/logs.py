"""Logging setup shared by nicfleet-agent and nicfleet-aggregator: one JSON object per
line, or text on a terminal. Here because proto is the only module both processes import.

Context fields (`node`, `device`, `port`, `rule`, ...) come from `extra=` at the call
sites. NKey seeds are masked in every line whatever logged them.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Final, Literal, TextIO

LogFormat = Literal["json", "text", "auto"]
LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("json", "text", "auto")
# Context fields a call site may pass with `extra=`; anything else in extra is ignored.
FIELDS: Final = ("node", "device", "port", "rule", "severity", "resource", "kind", "policy")
# NKey seeds (S + key type + base32): never printed, whichever library logged them.
_SEED: Final = re.compile(r"\bS[UNACOX][A-Z2-7]{50,}")
_MASK: Final = "[seed redacted]"


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: record.__dict__[k] for k in FIELDS if record.__dict__.get(k) is not None}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", <fields>, "exc"}` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return _SEED.sub(_MASK, json.dumps(event, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """The classic line, the context fields appended as `key=value`."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            head, sep, tail = line.partition("\n")  # fields before a traceback
            line = head + " " + " ".join(f"{k}={v}" for k, v in fields.items()) + sep + tail
        return _SEED.sub(_MASK, line)


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "text"]:
    """`auto`: text when `stream` is a terminal, JSON otherwise (a pod's log)."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure_logging(level: str, fmt: LogFormat, stream: TextIO | None = None) -> None:
    """One root handler on `stream` (default stderr), replacing the one an earlier call
    installed; handlers installed by others (a test harness) are left alone."""
    out = stream if stream is not None else sys.stderr
    handler = _Handler(stream)
    json_lines = resolve_format(fmt, out) == "json"
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


class _Handler(logging.StreamHandler[TextIO]):
    """Ours, so that a second `configure_logging` replaces it. Without a stream it writes
    to whatever `sys.stderr` is at emit time (as logging's last-resort handler does)."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream)
        self._fixed = stream

    @property
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        self._fixed = value


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
