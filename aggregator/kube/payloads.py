"""The pure halves of `aggregator.kube.client`'s calls: the bodies it sends (core/v1 Events,
the leader Lease, `nicfleet.io/*` label patches, TokenReviews), built and checked, and the
answers it reads back (JSON bodies, watch events, client exceptions -> KubeErrors). No I/O:
the caller passes the clock reading and the Event name's suffix, and sends; nothing here
imports `kubernetes`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from aggregator.errors import KubeError, KubeUnavailableError
from aggregator.kube.objects import LABEL_PREFIX, LeaseRecord, WatchEvent, error_from_status

COMPONENT: Final = "nicfleet-aggregator"
_REASON = re.compile(r"[A-Z][A-Za-z0-9]{0,127}")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")

EventType = Literal["Normal", "Warning"]


def check_node_labels(labels: Mapping[str, str | None]) -> None:
    """ValueError unless every key is a `nicfleet.io/*` label and every value (str) a valid
    label value: nicfleet never touches labels it does not own. None removes a label."""
    for key, value in labels.items():
        if not key.startswith(LABEL_PREFIX) or len(key) > len(LABEL_PREFIX) + 63:
            raise ValueError(f"label {key!r}: only {LABEL_PREFIX}* labels may be written")
        if value is not None and not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"label {key!r}: {value!r} is not a valid label value")


def event_body(
    *,
    api_version: str,
    kind: str,
    name: str,
    reason: str,
    message: str,
    type: EventType,
    uid: str | None,
    instance: str,
    namespace: str,
    now: dt.datetime,
    suffix: str,
) -> dict[str, Any]:
    """A core/v1 Event about object `kind/name`, named `<name>.<suffix>` in `namespace`.

    ValueError unless `reason` is an UpperCamelCase code of at most 128 characters (tools
    filter on it); `message` is cut to the 1024 characters the API server keeps."""
    if not _REASON.fullmatch(reason):
        raise ValueError(f"event reason {reason!r}: UpperCamelCase, at most 128 characters")
    return {
        "metadata": {"name": f"{name}.{suffix}", "namespace": namespace},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": name}
        | ({"uid": uid} if uid else {}),
        "reason": reason,
        "message": message[:1024],
        "type": type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now.isoformat(),
        "lastTimestamp": now.isoformat(),
        "count": 1,
    }


def lease_body(name: str, namespace: str, record: LeaseRecord, *, create: bool) -> dict[str, Any]:
    """The Lease to create, or the merge patch that updates it: with `resourceVersion` as
    precondition (the server answers 409 when the Lease changed since it was read)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if record.resource_version and not create:
        metadata["resourceVersion"] = record.resource_version
    spec: dict[str, Any] = {"holderIdentity": record.holder or ""}
    if record.duration_s is not None:
        spec["leaseDurationSeconds"] = record.duration_s
    if record.renew_time is not None:
        spec["renewTime"] = record.renew_time
    if record.transitions is not None:
        spec["leaseTransitions"] = record.transitions
    return {"metadata": metadata, "spec": spec}


def lease_from(name: str, raw: object) -> LeaseRecord:
    """The LeaseRecord of a Lease as the API server answered it; KubeError if not an object."""
    if not isinstance(raw, dict):
        raise KubeError(f"read Lease {name}: not an object")
    spec = raw.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or None,
        duration_s=spec.get("leaseDurationSeconds"),
        renew_time=spec.get("renewTime"),
        transitions=spec.get("leaseTransitions"),
        resource_version=(raw.get("metadata") or {}).get("resourceVersion"),
    )


def token_review_body(token: str, audiences: tuple[str, ...] = ()) -> dict[str, Any]:
    """An `authentication.k8s.io/v1` TokenReview of `token`.

    A plain dict, not a V1TokenReview model: a model's repr would show the token."""
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}


def decode_answer(what: str, status: int, reason: str | None, body: bytes) -> Any:
    """The decoded JSON of an answer (None when empty); KubeError for a non-2xx status."""
    if status >= 300:
        raise error_from_status(what, status, reason, body)
    try:
        return json.loads(body) if body else None
    except ValueError as exc:
        raise KubeUnavailableError(f"{what}: answer is not JSON: {exc}") from exc


def translated(what: str, exc: Any) -> KubeError:
    """The KubeError for the client's ApiException `exc` (status, reason, body)."""
    status = getattr(exc, "status", None)
    return error_from_status(
        what, status if isinstance(status, int) else None, exc.reason, exc.body
    )


def watch_params(timeout_s: int, resource_version: str | None) -> dict[str, Any]:
    """Keyword arguments of one watch session, resumed at `resource_version` if given."""
    kwargs: dict[str, Any] = {"timeout_seconds": timeout_s}
    if resource_version and resource_version != "...":  # kmock's placeholder
        kwargs["resource_version"] = resource_version
        kwargs["allow_watch_bookmarks"] = True
    return kwargs


def watch_event(event: Mapping[str, Any]) -> WatchEvent | None:
    """A watch stream's event (`return_type="object"`: plain dicts); None for a BOOKMARK,
    an ERROR or anything else that is not an object change."""
    kind = event.get("type")
    raw = event.get("raw_object")
    if kind in ("ADDED", "MODIFIED", "DELETED") and isinstance(raw, dict):
        return WatchEvent(type=kind, object=raw)
    return None
