"""The netlink reader: link and address notifications from the kernel via pyroute2.

The only module that imports pyroute2 (lazily: the import costs ~0.2 s and must not slow
down `nicfleet-agent snapshot`). It decodes kernel messages into the plain observations
of `agent.links.netdevs` and decides nothing; every failure is a `NetlinkUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from agent.errors import AgentError
from agent.links.netdevs import AddressObservation, LinkObservation, Observation

# linux/rtnetlink.h: message types and multicast groups (kernel ABI, never renumbered)
RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
GROUPS = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
NETLINK_ROUTE = 0

# Where `ip netns add NAME` (and pyroute2) keep named network namespaces.
NETNS_RUN_DIR = Path("/var/run/netns")


class NetlinkUnavailable(AgentError):
    """Netlink cannot be used (not Linux, no permission, no such netns, socket lost)."""


def netns_path(netns: str) -> Path:
    """A bare name is a namespace of `ip netns`; anything with a '/' is a path to one
    (e.g. /proc/<pid>/ns/net). Raises NetlinkUnavailable when it does not exist."""
    path = Path(netns) if "/" in netns else NETNS_RUN_DIR / netns
    if netns in ("", ".", "..") or not path.exists():
        raise NetlinkUnavailable(f"no network namespace {netns!r} ({path} does not exist)")
    if path.is_dir():
        raise NetlinkUnavailable(f"{path} is a directory, not a network namespace")
    return path


def decode(message: Any) -> Observation | None:
    """A pyroute2 ifinfmsg/ifaddrmsg as an observation; None for anything else."""
    kind = message["header"]["type"]
    if kind in (RTM_NEWLINK, RTM_DELLINK):
        name = message.get("ifname")
        if not isinstance(name, str):
            return None
        operstate = message.get("operstate")
        carrier = message.get("carrier")
        mtu = message.get("mtu")
        address = message.get("address")
        return LinkObservation(
            index=int(message["index"]),
            name=name,
            # pyroute2 spells IFLA_OPERSTATE "UP"; sysfs (and our snapshot) say "up".
            operstate=operstate.lower() if isinstance(operstate, str) else None,
            carrier=bool(carrier) if isinstance(carrier, int) else None,
            mtu=mtu if isinstance(mtu, int) else None,
            address=address if isinstance(address, str) else None,
            removed=kind == RTM_DELLINK,
        )
    if kind in (RTM_NEWADDR, RTM_DELADDR):
        # IPv4 reports the interface's own address in IFA_LOCAL (IFA_ADDRESS is the
        # peer on point-to-point links); IPv6 has only IFA_ADDRESS.
        address = message.get("local") or message.get("address")
        if not isinstance(address, str):
            return None
        return AddressObservation(
            index=int(message["index"]),
            address=f"{address}/{int(message['prefixlen'])}",
            removed=kind == RTM_DELADDR,
        )
    return None


class NetlinkWatcher:
    """One rtnetlink socket subscribed to link and address changes.

    Bind first, then `dump()`: a change between the two is then both in the dump and
    queued as a notification, never in neither. `changes()` returns the next batch.
    """

    def __init__(self, *, netns: str | None = None, rcvbuf: int = 1 << 20) -> None:
        self.netns = netns
        self.rcvbuf = rcvbuf  # notifications the kernel may queue while we are busy
        self._ipr: Any = None
        self._errors: tuple[type[Exception], ...] = (OSError,)

    async def __aenter__(self) -> Self:
        if sys.platform != "linux":
            raise NetlinkUnavailable(f"netlink needs Linux, this is {sys.platform}")
        try:
            from pyroute2 import AsyncIPRoute
            from pyroute2.netlink.exceptions import NetlinkDecodeError, NetlinkError
        except ImportError as exc:
            raise NetlinkUnavailable(f"pyroute2 cannot be imported: {exc}") from exc
        self._errors = (OSError, NetlinkError, NetlinkDecodeError)
        try:
            if self.netns is None:
                self._ipr = AsyncIPRoute(rcvbuf=self.rcvbuf)
            else:
                fd = await asyncio.to_thread(_socket_in_netns, netns_path(self.netns))
                self._ipr = AsyncIPRoute(fileno=fd, rcvbuf=self.rcvbuf)
            await self._ipr.bind(GROUPS)
        except self._errors as exc:
            await self.__aexit__(None, None, None)
            raise NetlinkUnavailable(f"cannot subscribe to rtnetlink: {exc}") from exc
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ipr, self._ipr = self._ipr, None
        if ipr is not None:
            ipr.close()

    async def dump(self) -> list[Observation]:
        """Every link, then every address, as the kernel has them now."""
        observations: list[Observation] = []
        try:
            async for message in await self._ipr.link("dump"):
                observations.extend(_decoded(message))
            async for message in await self._ipr.addr("dump"):
                observations.extend(_decoded(message))
        except self._errors as exc:
            raise NetlinkUnavailable(f"rtnetlink dump failed: {exc}") from exc
        return observations

    async def changes(self) -> Sequence[Observation]:
        """The next batch of notifications (waits for one to arrive).

        An overrun socket (ENOBUFS) has lost notifications: that raises
        NetlinkUnavailable, and the caller re-opens and compares a fresh dump.
        """
        try:
            async with contextlib.aclosing(self._ipr.get()) as messages:
                return [obs async for message in messages for obs in _decoded(message)]
        except self._errors as exc:
            raise NetlinkUnavailable(f"rtnetlink socket failed: {exc}") from exc


def _socket_in_netns(path: Path) -> int:
    """The fd of a NETLINK_ROUTE socket created inside the namespace at `path`.

    pyroute2's own netns support forks a helper process, and a fork of an asyncio
    process shares the loop's signal wakeup fd: the helper's SIGTERM reached the agent
    as its own and stopped it. setns() instead moves only the calling thread, so a
    short-lived thread of our own enters the namespace, opens the socket (a socket
    stays in the namespace it was created in) and ends.
    """
    from pyroute2.netns import setns

    outcome: list[int | OSError] = []

    def enter_and_open() -> None:
        try:
            setns(str(path), flags=0)  # flags=0: never create a missing namespace
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
            outcome.append(sock.detach())
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=enter_and_open, name="nicfleet-netns")
    thread.start()
    thread.join()
    if isinstance(outcome[0], OSError):
        raise outcome[0]
    return outcome[0]


def _decoded(message: Any) -> list[Observation]:
    observation = decode(message)
    return [] if observation is None else [observation]
