"""Alert lifecycle: findings in, alert states and firing/resolved transitions out.

Pure: no I/O, no clock (`now` is passed in), no logging. One `Tracked` per fingerprint
(rule, node, subject) goes pending → firing (after the rule's `for`) → resolved (after
the finding has been absent for the rule's `clear`); flapping alerts are held firing.
A firing alert whose finding is absent because its rule can no longer judge the subject
(`Unjudged` names why: its input went away) is unknown, not resolved: still open, not
notified, `evidence.unknown` the reason; it resolves only once the rule judges again.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from aggregator.rules.finding import Finding
from proto.messages.alerts import Alert

Phase = Literal["pending", "firing", "unknown", "resolved"]
OPEN: Final[frozenset[str]] = frozenset({"firing", "unknown"})  # notified, not resolved
# Alerts about the fleet as a whole (no node) carry this in `node` and in the subject.
FLEET_NODE: Final = "_fleet"
FLAPPING_KEY: Final = "flapping"
UNKNOWN_KEY: Final = "unknown"  # evidence of an unknown alert: why it cannot be judged
# Why the rule of an open alert whose finding is absent cannot judge its subject now (its
# input went away), or None: the absence is a real "no longer found".
Unjudged = Callable[[Alert], str | None]


def judged(alert: Alert) -> None:
    """The default `Unjudged`: every absence is a verdict."""
    return None


_SEVERITY_RANK: Final = {"critical": 0, "warning": 1, "info": 2}


@dataclass(frozen=True, kw_only=True)
class RuleTiming:
    for_s: float = 0.0  # the finding must persist this long before the alert fires
    clear_s: float = 0.0  # ... and be absent this long before it resolves


@dataclass(frozen=True, kw_only=True)
class LifecycleSettings:
    timings: Mapping[str, RuleTiming] = field(default_factory=dict)  # rule id -> timing
    default: RuleTiming = RuleTiming()
    flap_count: int = 4  # this many firings within flap_window_s → flapping
    flap_window_s: float = 300.0  # ... and a flapping alert resolves only after this long
    resolved_retention_s: float = 3600.0  # resolved alerts stay listed this long

    def timing(self, rule: str) -> RuleTiming:
        return self.timings.get(rule, self.default)


def holding(settings: LifecycleSettings, rules: Iterable[str], until_s: float) -> LifecycleSettings:
    """`settings` with the `for` of `rules` lasting at least `until_s` (a finding pending
    since the hold began fires when it ends, if it still holds; one gone is never sent)."""
    timings = dict(settings.timings)
    for rule in rules:
        timing = settings.timing(rule)
        timings[rule] = RuleTiming(for_s=max(timing.for_s, until_s), clear_s=timing.clear_s)
    return LifecycleSettings(
        timings=timings, default=settings.default, flap_count=settings.flap_count,
        flap_window_s=settings.flap_window_s, resolved_retention_s=settings.resolved_retention_s,
    )  # fmt: skip


class Tracked(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.alert-state"
):
    """One fingerprint's state; persisted as is in KV `nicfleet-alerts`."""

    version: int = 1
    phase: Phase
    alert: Alert  # the latest view; `alert.state` is the last state delivered
    pending_since: float | None = None
    absent_since: float | None = None
    fired_at: tuple[float, ...] = ()  # firings within the flap window, oldest first
    flapping: bool = False


@dataclass(frozen=True, kw_only=True)
class Step:
    states: dict[str, Tracked]
    transitions: tuple[Alert, ...]  # to deliver, in order
    changed: frozenset[str]  # fingerprints whose state must be persisted
    removed: frozenset[str]  # fingerprints to forget


def fingerprint(rule: str, node: str | None, subject: str) -> str:
    """A stable, KV-key-safe hash of (rule, node, subject)."""
    raw = "\x00".join((rule, node if node is not None else FLEET_NODE, subject))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def stringify(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).lower()
    return str(value)


def alert_of(finding: Finding, starts_at: float, *, flapping: bool = False) -> Alert:
    evidence = {key: stringify(value) for key, value in finding.evidence.items()}
    if flapping:
        evidence[FLAPPING_KEY] = "true"
    return Alert(
        rule=finding.rule,
        severity=finding.severity,
        state="firing",
        node=finding.node if finding.node is not None else FLEET_NODE,
        subject=finding.subject,
        message=finding.message,
        evidence=evidence,
        starts_at=starts_at,
        fingerprint=fingerprint(finding.rule, finding.node, finding.subject),
    )


def step(
    states: Mapping[str, Tracked],
    findings: Iterable[Finding],
    now: float,
    settings: LifecycleSettings,
    *,
    held: frozenset[str] = frozenset(),
    unjudged: Unjudged = judged,
) -> Step:
    """Advance every alert to `now` given the findings present now.

    Alerts on `held` nodes (not heard from since a restart) keep their state while their
    finding is absent: absence of evidence from stale data is not a resolve. An open
    alert whose finding is absent and that `unjudged` gives a reason for becomes unknown.
    """
    present = _by_key(findings, lambda f: fingerprint(f.rule, f.node, f.subject))
    todo = sorted(set(states) | set(present))
    return _advance(states, present, todo, {}, now, settings, held, unjudged)


class Stepper:
    """`step`, called cycle after cycle with the states it returned last: same result,
    but only the fingerprints whose finding changed (another object) or whose state may
    move with time are advanced; a firing alert whose finding is the very same object as
    last time stays as it is (which `step` would also find). Other states (a load):
    everything is advanced."""

    def __init__(self) -> None:
        self._keys: dict[int, tuple[Finding, str]] = {}  # id -> (the finding, fingerprint)
        self._last: tuple[Mapping[str, Tracked], dict[str, Finding]] | None = None

    def step(
        self,
        states: Mapping[str, Tracked],
        findings: Iterable[Finding],
        now: float,
        settings: LifecycleSettings,
        *,
        held: frozenset[str] = frozenset(),
        unjudged: Unjudged = judged,
    ) -> Step:
        known, keys = self._keys, {}

        def key_of(f: Finding) -> str:
            hit = known.get(id(f))
            key = hit[1] if hit is not None and hit[0] is f else fingerprint(
                f.rule, f.node, f.subject
            )  # fmt: skip
            keys[id(f)] = (f, key)
            return key

        present = _by_key(findings, key_of)
        self._keys = keys  # holds the findings, so that their ids are not reused
        last = self._last
        if last is None or last[0] is not states:
            todo: Iterable[str] = sorted(set(states) | set(present))
            result: dict[str, Tracked] = {}
        else:
            before = last[1]
            todo = [
                k for k, f in present.items()
                if before.get(k) is not f or (old := states.get(k)) is None
                or old.phase != "firing"
            ]  # fmt: skip
            # A resolved alert only waits out its retention: skip it until it would move
            # (a fleet-wide episode leaves one per node, listed for an hour).
            todo.extend(
                k for k in states.keys() - present.keys() if not _resting(states[k], now, settings)
            )
            result = dict(states)
        done = _advance(states, present, todo, result, now, settings, held, unjudged)
        self._last = (done.states, present)
        return done


def _by_key(findings: Iterable[Finding], key_of: Callable[[Finding], str]) -> dict[str, Finding]:
    """The finding per fingerprint; of several, the most severe (the first of equals)."""
    present: dict[str, Finding] = {}
    for finding in findings:
        key = key_of(finding)
        other = present.get(key)
        if other is None or _SEVERITY_RANK[finding.severity] < _SEVERITY_RANK[other.severity]:
            present[key] = finding
    return present


def _advance(
    states: Mapping[str, Tracked],
    present: Mapping[str, Finding],
    todo: Iterable[str],
    result: dict[str, Tracked],
    now: float,
    settings: LifecycleSettings,
    held: frozenset[str],
    unjudged: Unjudged,
) -> Step:
    """Advance the states of `todo` into `result` (which holds the others already)."""
    transitions: list[Alert] = []
    changed: set[str] = set()
    removed: set[str] = set()
    for key in todo:
        old = states.get(key)
        current = present.get(key)
        new: Tracked | None
        emitted: Alert | None
        if current is not None:
            new, emitted = _present(old, current, now, settings)
        elif old is not None and old.alert.node in held:
            new, emitted = old, None
        elif old is not None:
            new, emitted = _absent(old, now, settings, unjudged)
        else:
            continue
        if emitted is not None:
            transitions.append(emitted)
        if new is None:
            removed.add(key)
            result.pop(key, None)
            continue
        result[key] = new
        if new != old:
            changed.add(key)
    return Step(
        states=result,
        transitions=tuple(sorted(transitions, key=lambda a: (a.node, a.rule, a.subject))),
        changed=frozenset(changed),
        removed=frozenset(removed),
    )


def _resting(old: Tracked, now: float, settings: LifecycleSettings) -> bool:
    """Whether `_absent(old, now, settings)` would return `old` itself: a resolved alert
    whose firings are all still within the flap window and, with none, whose retention
    has not run out (the same comparisons as `_absent`)."""
    if old.phase != "resolved":
        return False
    window = settings.flap_window_s
    if old.fired_at:
        return all(now - t < window for t in old.fired_at)
    ends_at = old.alert.ends_at if old.alert.ends_at is not None else now
    return not now - ends_at >= settings.resolved_retention_s


def _recent(fired_at: tuple[float, ...], now: float, window: float) -> tuple[float, ...]:
    return tuple(t for t in fired_at if now - t < window)


def _present(
    old: Tracked | None, finding: Finding, now: float, settings: LifecycleSettings
) -> tuple[Tracked, Alert | None]:
    timing = settings.timing(finding.rule)
    if old is not None and old.phase in OPEN:  # unknown and found again: firing on
        alert = alert_of(finding, old.alert.starts_at, flapping=old.flapping)
        new = msgspec.structs.replace(old, phase="firing", alert=alert, absent_since=None)
        # A severity change is news (it moves to another subject); evidence updates are not.
        emitted = alert if alert.severity != old.alert.severity else None
        return new, emitted
    pending_since = old.pending_since if old is not None and old.phase == "pending" else None
    if pending_since is None:
        pending_since = now
    fired_at = _recent(old.fired_at, now, settings.flap_window_s) if old is not None else ()
    if now - pending_since < timing.for_s:
        pending = Tracked(
            phase="pending",
            alert=alert_of(finding, pending_since),
            pending_since=pending_since,
            fired_at=fired_at,
            flapping=old.flapping if old is not None else False,
        )
        if old is not None and old.phase == "resolved":
            # Keep the resolved view listed while the new episode is pending.
            pending = msgspec.structs.replace(pending, alert=old.alert)
        return pending, None
    fired_at = (*fired_at, now)
    flapping = len(fired_at) >= settings.flap_count
    alert = alert_of(finding, now, flapping=flapping)
    return Tracked(phase="firing", alert=alert, fired_at=fired_at, flapping=flapping), alert


def _absent(
    old: Tracked, now: float, settings: LifecycleSettings, unjudged: Unjudged = judged
) -> tuple[Tracked | None, Alert | None]:
    if old.phase in OPEN:
        reason = unjudged(old.alert)
        if reason is not None:
            return _unknown(old, reason), None
        if old.phase == "unknown":  # judged again and not found: resolving starts now
            evidence = {k: v for k, v in old.alert.evidence.items() if k != UNKNOWN_KEY}
            alert = msgspec.structs.replace(old.alert, evidence=evidence)
            old = msgspec.structs.replace(old, phase="firing", alert=alert, absent_since=None)
    fired_at = _recent(old.fired_at, now, settings.flap_window_s)
    if old.phase == "pending":
        if old.alert.state == "resolved":  # an earlier episode is still listed
            return msgspec.structs.replace(old, phase="resolved", pending_since=None), None
        return None, None  # never fired: nothing to tell anyone
    if old.phase == "resolved":
        ends_at = old.alert.ends_at if old.alert.ends_at is not None else now
        if now - ends_at >= settings.resolved_retention_s and not fired_at:
            return None, None
        if fired_at != old.fired_at:
            return msgspec.structs.replace(old, fired_at=fired_at), None
        return old, None
    absent_since = old.absent_since if old.absent_since is not None else now
    hold = settings.timing(old.alert.rule).clear_s
    if old.flapping:
        hold = max(hold, settings.flap_window_s)
    if now - absent_since < hold:
        return msgspec.structs.replace(old, absent_since=absent_since), None
    resolved = msgspec.structs.replace(old.alert, state="resolved", ends_at=now)
    return (
        Tracked(phase="resolved", alert=resolved, fired_at=fired_at, flapping=False),
        resolved,
    )


def _unknown(old: Tracked, reason: str) -> Tracked:
    """`old` (open) while its rule cannot judge: the last finding's view, the reason in
    its evidence; no resolve clock runs (absence of a verdict is not a resolve)."""
    if old.phase == "unknown" and old.alert.evidence.get(UNKNOWN_KEY) == reason:
        return old
    evidence = {**old.alert.evidence, UNKNOWN_KEY: reason}
    alert = msgspec.structs.replace(old.alert, evidence=evidence)
    return msgspec.structs.replace(old, phase="unknown", alert=alert, absent_since=None)


def firing(states: Mapping[str, Tracked]) -> list[Alert]:
    """Open alerts (firing or unknown): what receivers hold as firing."""
    return [s.alert for s in states.values() if s.phase in OPEN]


def listed(states: Mapping[str, Tracked]) -> list[Alert]:
    """Alerts shown by the API: firing ones and recently resolved ones (not pending)."""
    return [s.alert for s in states.values() if s.phase != "pending" or s.alert.state == "resolved"]
