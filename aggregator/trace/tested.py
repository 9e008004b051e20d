"""The chain trace's last link: the newest finished pair validation of a resource with a
node, as `tested-data-path` (ok, broken with the validation's reason, or unknown when never
validated or too long ago). Pure.
"""

from __future__ import annotations

from typing import Any, Final

from aggregator.trace.host import link_broken, link_ok, link_unknown
from proto.http import Link, ValidationRecord

TESTED_LINK: Final = "tested-data-path"


RECENT_S: Final = 24 * 3600.0  # a passed validation older than this is "unknown" again


def data_path_link(record: ValidationRecord | None, node: str, resource: str, now: float) -> Link:
    """The trace's last link: the newest finished validation of `resource` with `node`."""
    command = f"nicfleetctl validate {node} <other-node> --resource {resource}"
    if record is None:
        return link_unknown(TESTED_LINK, validated="never validated", command=command)
    age = now - (record.finished_at or record.updated_at)
    evidence: dict[str, Any] = {
        "validation": record.id,
        "nodes": list(record.nodes),
        "phase": record.phase,
        "passed": record.passed,
        "bytes_per_second": record.bytes_per_second,
        "latency_p50_us": record.latency_p50_us,
        "age_s": age,
    }
    if not record.passed:
        return link_broken(
            TESTED_LINK,
            f"validation {record.id} ({' ↔ '.join(record.nodes)}) {record.phase}: "
            f"{record.reason or 'no reason given'}",
            f"fix the links above, then re-run: {command}",
            **evidence,
        )
    if age > RECENT_S:
        return link_unknown(
            TESTED_LINK, note=f"last passed {age / 3600:.0f}h ago; re-run: {command}", **evidence
        )
    return link_ok(TESTED_LINK, **evidence)
