"""One run of `verify`: evidence, verdict and (when asked) the pair test, as one
ValidationResult. The pair test only starts on rdma-path evidence; otherwise the peer is
told why (pyverbs method) and the result carries the reason, never a number.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from agent.host.verbs import load_pyverbs
from agent.verify.evidence import EvidenceSettings, collect_evidence
from agent.verify.pair import handshake
from agent.verify.pair import sides as pairtest
from agent.verify.pair.queuepair import PyverbsQueuePair, RdmaTestError
from agent.verify.verdict import choose_port, judge
from proto.messages.validation import (
    Evidence,
    PairTestMethod,
    PairTestResult,
    Reason,
    ValidationResult,
    ValidationRole,
    Verdict,
)

Method = Literal["auto", "pyverbs", "perftest"]


@dataclass(frozen=True, kw_only=True)
class VerifySettings:
    evidence: EvidenceSettings
    role: ValidationRole | None = None  # server: --serve; client: --peer; None: no pair test
    peer: tuple[str, int] | None = None
    listen: tuple[str, int] = ("0.0.0.0", pairtest.DEFAULT_PORT)
    method: Method = "auto"
    pair: pairtest.PairSettings = field(default_factory=pairtest.PairSettings)
    validation_id: str | None = None


async def run_verify(settings: VerifySettings, *, environ: Mapping[str, str]) -> ValidationResult:
    started = time.time()
    evidence = await collect_evidence(settings.evidence)
    verdict, reasons = judge(evidence)
    pair = None
    if settings.role is not None:
        pair = await _pair_test(settings, evidence, verdict, reasons)
    return ValidationResult(
        validation_id=settings.validation_id,
        role=settings.role,
        node=environ.get("NODE_NAME"),
        pod=environ.get("POD_NAME") or socket.gethostname(),
        verdict=verdict,
        reasons=reasons,
        evidence=evidence,
        pair_test=pair,
        started_at=started,
        finished_at=time.time(),
    )


def _method(settings: VerifySettings) -> PairTestMethod:
    if settings.method == "auto":
        return "perftest" if pairtest.perftest_available() else "pyverbs"
    return settings.method


async def _pair_test(
    settings: VerifySettings, evidence: Evidence, verdict: Verdict, reasons: tuple[Reason, ...]
) -> PairTestResult:
    method = _method(settings)
    peer = f"{settings.peer[0]}:{settings.peer[1]}" if settings.peer else None
    chosen = choose_port(evidence) if verdict == "rdma-path" else None
    if chosen is None:
        refusal = (
            f"evidence verdict is {verdict}: " + "; ".join(r.message for r in reasons)
            if verdict != "rdma-path"
            else "no ACTIVE port with a usable GID on the pod's RDMA devices"
        )
        if method == "pyverbs":  # a perftest peer does not speak our handshake
            await _tell_peer(settings, refusal)
        return PairTestResult(method=method, peer=peer, error=refusal)
    device, port, gid_index = chosen
    if method == "perftest":
        return await pairtest.run_perftest(
            device=device,
            gid_index=gid_index,
            port=settings.peer[1] if settings.peer else settings.listen[1],
            peer=settings.peer[0] if settings.peer else None,
            settings=settings.pair,
        )

    def open_qp() -> PyverbsQueuePair:
        try:
            pv = load_pyverbs(settings.evidence.verbs_path)
        except ImportError as exc:
            raise RdmaTestError(f"pyverbs cannot be loaded: {exc}") from exc
        return PyverbsQueuePair(
            pv, device=device, port=port, gid_index=gid_index, size=settings.pair.message_size
        )

    if settings.peer is not None:
        return await pairtest.run_pyverbs(*settings.peer, open_qp, settings.pair)
    try:
        channel = await _accept(settings)
    except handshake.HandshakeError as exc:
        return PairTestResult(method=method, error=str(exc))
    return await pairtest.serve_pyverbs(channel, open_qp, settings.pair)


async def _accept(settings: VerifySettings) -> handshake.Channel:
    server, queue = await pairtest.listen(*settings.listen, settings.pair.timeout)
    return await pairtest.accept_one(server, queue, settings.pair.timeout)


async def _tell_peer(settings: VerifySettings, reason: str) -> None:
    """Fail the other side fast: it gets our reason instead of waiting for a timeout."""
    try:
        if settings.peer is not None:
            channel = await handshake.connect(*settings.peer, timeout=settings.pair.timeout)
        else:
            channel = await _accept(settings)
    except handshake.HandshakeError:
        return  # the peer is not there either; our own result says why
    await pairtest.refuse(channel, reason)
