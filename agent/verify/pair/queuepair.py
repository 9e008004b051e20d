"""The RC queue pair of the pair test, behind the `QueuePair` boundary the handshake drives.

`PyverbsQueuePair` is the only code that talks to RDMA hardware (pyverbs via agent.host.verbs);
it cannot run without a device, so its tests are marked `rdma_hw`. Calls block (they poll
completion queues) and each takes a timeout, so a dead peer never hangs a thread forever.
"""

from __future__ import annotations

import random
import time
from typing import Any, NamedTuple, Protocol

from agent.errors import AgentError
from agent.verify.pair.handshake import Endpoint, Mtu

# Outstanding work requests per queue; enough to keep a 200 Gb/s link busy with 64 KiB.
DEPTH = 64
PING_BYTES = 8
_MTU_ENUM: dict[Mtu, int] = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}  # enum ibv_mtu


class RdmaTestError(AgentError):
    """The queue pair could not be set up or a transfer failed."""


class Transfer(NamedTuple):
    transferred: int  # bytes
    seconds: float


class QueuePair(Protocol):
    """What the pair test needs from one side's RC queue pair."""

    def endpoint(self) -> Endpoint: ...
    def connect(self, remote: Endpoint) -> None: ...
    def post_receives(self, count: int) -> None: ...
    def serve_latency(self, iterations: int, timeout: float) -> None: ...
    def write_bandwidth(
        self, remote: Endpoint, size: int, iterations: int, timeout: float
    ) -> Transfer: ...
    def ping_pong(self, iterations: int, timeout: float) -> list[float]: ...
    def close(self) -> None: ...


class PyverbsQueuePair:
    """An RC QP on (device, port, gid_index) with one registered buffer of `size` bytes."""

    def __init__(self, pv: Any, *, device: str, port: int, gid_index: int, size: int) -> None:
        self._pv, self._e = pv, pv.enums
        self.device, self.port, self.gid_index, self.size = device, port, gid_index, size
        errors = (pv.pyverbs_error.PyverbsError, OSError)
        try:
            self._ctx = pv.device.Context(name=device)
            self._port_attr = self._ctx.query_port(port)
            self._gid = self._ctx.query_gid(port, gid_index)
            self._pd = pv.pd.PD(self._ctx)
            self._send_cq = pv.cq.CQ(self._ctx, DEPTH * 2, None, None, 0)
            self._recv_cq = pv.cq.CQ(self._ctx, DEPTH * 2, None, None, 0)
            access = self._e.IBV_ACCESS_LOCAL_WRITE | self._e.IBV_ACCESS_REMOTE_WRITE
            self._mr = pv.mr.MR(self._pd, size, access)
            cap = pv.qp.QPCap(max_send_wr=DEPTH, max_recv_wr=DEPTH, max_send_sge=1,
                              max_recv_sge=1)  # fmt: skip
            init = pv.qp.QPInitAttr(qp_type=self._e.IBV_QPT_RC, scq=self._send_cq,
                                    rcq=self._recv_cq, cap=cap, sq_sig_all=1)  # fmt: skip
            self._qp = pv.qp.QP(self._pd, init)
        except errors as exc:
            self.close()
            raise RdmaTestError(
                f"cannot set up an RC queue pair on {device}/{port}: {exc}"
            ) from exc
        self._psn = random.getrandbits(24)

    def endpoint(self) -> Endpoint:
        mtu = {v: k for k, v in _MTU_ENUM.items()}.get(int(self._port_attr.active_mtu), 1024)
        return Endpoint(
            qpn=self._qp.qp_num, psn=self._psn, lid=self._port_attr.lid, gid=self._gid.gid,
            gid_index=self.gid_index, mtu=mtu, rkey=self._mr.rkey, addr=self._mr.buf,
            size=self.size, device=self.device, port=self.port,
        )  # fmt: skip

    def connect(self, remote: Endpoint) -> None:
        pv, e = self._pv, self._e
        try:
            attr = pv.qp.QPAttr(port_num=self.port)
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            self._qp.to_init(attr)
            dgid = pv.addr.GID()
            dgid.gid = remote.gid
            route = pv.addr.GlobalRoute(dgid=dgid, sgid_index=self.gid_index, hop_limit=64)
            attr.ah_attr = pv.addr.AHAttr(gr=route, is_global=1, port_num=self.port,
                                          dlid=remote.lid)  # fmt: skip
            attr.path_mtu = _MTU_ENUM[min(remote.mtu, self.endpoint().mtu)]
            attr.dest_qp_num, attr.rq_psn = remote.qpn, remote.psn
            attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
            self._qp.to_rtr(attr)
            attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry = self._psn, 14, 7, 7
            attr.max_rd_atomic = 1
            self._qp.to_rts(attr)
        except (pv.pyverbs_error.PyverbsError, OSError) as exc:
            raise RdmaTestError(f"cannot connect the queue pair to {remote.device}: {exc}") from exc

    def _sge(self, length: int) -> Any:
        return self._pv.wr.SGE(self._mr.buf, length, self._mr.lkey)

    def post_receives(self, count: int) -> None:
        for _ in range(min(count, DEPTH)):
            self._qp.post_recv(self._pv.wr.RecvWR(num_sge=1, sg=[self._sge(PING_BYTES)]))

    def _send(self, opcode: int, length: int, remote: Endpoint | None = None) -> None:
        wr = self._pv.wr.SendWR(opcode=opcode, num_sge=1, sg=[self._sge(length)])
        if remote is not None:
            wr.set_wr_rdma(remote.rkey, remote.addr)
        self._qp.post_send(wr)

    def _complete(self, cq: Any, deadline: float, what: str) -> None:
        while True:
            polled, wcs = cq.poll(1)
            if polled:
                if wcs[0].status != self._e.IBV_WC_SUCCESS:
                    raise RdmaTestError(f"{what} failed: work completion status {wcs[0].status}")
                return
            if time.monotonic() > deadline:
                raise RdmaTestError(f"no {what} completion before the timeout")

    def write_bandwidth(
        self, remote: Endpoint, size: int, iterations: int, timeout: float
    ) -> Transfer:
        deadline = time.monotonic() + timeout
        posted = done = 0
        start = time.perf_counter()
        while done < iterations:
            while posted < iterations and posted - done < DEPTH:
                self._send(self._e.IBV_WR_RDMA_WRITE, size, remote)
                posted += 1
            self._complete(self._send_cq, deadline, "RDMA write")
            done += 1
        return Transfer(size * iterations, time.perf_counter() - start)

    def serve_latency(self, iterations: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for _ in range(iterations):
            self._complete(self._recv_cq, deadline, "receive")
            self.post_receives(1)
            self._send(self._e.IBV_WR_SEND, PING_BYTES)
            self._complete(self._send_cq, deadline, "send")

    def ping_pong(self, iterations: int, timeout: float) -> list[float]:
        deadline = time.monotonic() + timeout
        rtts: list[float] = []
        for _ in range(iterations):
            self.post_receives(1)
            start = time.perf_counter()
            self._send(self._e.IBV_WR_SEND, PING_BYTES)
            self._complete(self._send_cq, deadline, "send")
            self._complete(self._recv_cq, deadline, "receive")
            rtts.append(time.perf_counter() - start)
        return rtts

    def close(self) -> None:
        for name in ("_qp", "_mr", "_send_cq", "_recv_cq", "_pd", "_ctx"):
            resource = getattr(self, name, None)
            if resource is not None:
                resource.close()
