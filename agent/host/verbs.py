"""The optional verbs probe: can this host (or pod) open RDMA devices through libibverbs?

The only module that loads pyverbs (rdma-core's binding, the OS package python3-pyverbs),
lazily; `probe_verbs` answers one line for `Platform.verbs`, `query_devices` opens each
device context for `verify`, `load_pyverbs` hands the binding to agent.verify.pair.queuepair. Probes
never raise. Stdlib only at import, so it also runs under the system Python.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace

UNAVAILABLE = "verbs unavailable"


def probe_verbs(*, search_path: Path | None = None) -> str:
    """Answer "ok: N devices" or "verbs unavailable: <reason>".

    `search_path` is a directory holding the `pyverbs` package (Debian installs it in
    /usr/lib/python3/dist-packages for the system Python). Only that package is loaded
    from there: the whole directory on sys.path would let any other Debian package fill
    a gap in the agent's own environment unnoticed.
    """
    try:
        device, errors = _import_pyverbs(search_path)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "pyverbs":
            return f"{UNAVAILABLE}: pyverbs not installed"
        return f"{UNAVAILABLE}: pyverbs cannot be imported: {exc}"
    except ImportError as exc:  # e.g. built for another Python ABI
        return f"{UNAVAILABLE}: pyverbs cannot be imported: {exc}"
    try:
        devices = device.get_device_list()
    except (errors.PyverbsError, OSError) as exc:
        # Without RDMA devices (or without the kernel's RDMA subsystem) rdma-core says
        # "Failed to get devices list".
        return f"{UNAVAILABLE}: {str(exc).strip() or type(exc).__name__}"
    return f"ok: {len(devices)} devices"


@dataclass(frozen=True)
class DeviceQuery:
    """What `query_devices` found (stdlib only: agent.verify.evidence turns it into evidence)."""

    available: bool
    detail: str
    opened: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)


def query_devices(names: Iterable[str], *, search_path: Path | None = None) -> DeviceQuery:
    """Open a context on each named device and query every port; never raises."""
    detail = probe_verbs(search_path=search_path)
    if not detail.startswith("ok"):
        return DeviceQuery(available=False, detail=detail)
    device, errors = _import_pyverbs(search_path)
    opened: list[str] = []
    failed: dict[str, str] = {}
    for name in names:
        try:
            with device.Context(name=name) as ctx:
                ports = ctx.query_device().phys_port_cnt
                for port in range(1, ports + 1):
                    ctx.query_port(port)
        except (errors.PyverbsError, OSError) as exc:
            failed[name] = str(exc).strip() or type(exc).__name__
        else:
            opened.append(name)
    return DeviceQuery(available=True, detail=detail, opened=tuple(opened), failed=failed)


def load_pyverbs(search_path: Path | None = None) -> SimpleNamespace:
    """The pyverbs modules the RC queue-pair test needs, as one namespace.

    Raises ImportError (ModuleNotFoundError) when the binding is missing or broken.
    """
    _import_pyverbs(search_path)
    names = ("device", "pd", "cq", "mr", "qp", "wr", "addr", "enums", "pyverbs_error")
    return SimpleNamespace(**{n: importlib.import_module(f"pyverbs.{n}") for n in names})


def _import_pyverbs(search_path: Path | None) -> tuple[ModuleType, ModuleType]:
    if search_path is not None and "pyverbs" not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec("pyverbs", [str(search_path)])
        if spec is None or spec.loader is None:
            raise ModuleNotFoundError(f"no pyverbs package in {search_path}", name="pyverbs")
        package = importlib.util.module_from_spec(spec)
        sys.modules["pyverbs"] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules["pyverbs"]
            raise
    device = importlib.import_module("pyverbs.device")
    return device, importlib.import_module("pyverbs.pyverbs_error")
