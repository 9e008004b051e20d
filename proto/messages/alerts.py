"""Alert transitions on `nicfleet.v1.alert.<severity>.<rule>.<node>`."""

from __future__ import annotations

from typing import Literal

import msgspec

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION

Severity = Literal["critical", "warning", "info"]


AlertState = Literal["firing", "resolved"]


class Alert(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.Alert"):
    version: int = MESSAGES_VERSION
    rule: str
    severity: Severity
    state: AlertState
    node: str
    subject: str
    message: str
    evidence: dict[str, str] = msgspec.field(default_factory=dict)
    starts_at: float
    ends_at: float | None = None
    fingerprint: str
