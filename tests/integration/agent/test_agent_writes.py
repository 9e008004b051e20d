"""Write audit of the real `nicfleet-agent run` process: every path it creates, writes,
renames, removes, chmods or binds is under the device-plugin, plugin-registry or CDI dir,
and the sysfs tree is byte-identical afterwards. Two independent layers: a Python audit
hook in the agent process, and strace (when installed) for writes done in C (gRPC)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.deviceplugin.sockets import socket_name
from agent.lab.faults import port_down, port_up
from agent.lab.hotplug import STASH, device_add, device_remove
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from aggregator.bus.natsserver import NatsServer
from proto.codec import encode
from proto.dpconfig import ConfigError, resource_full_name, validate_device_plugin_config
from proto.messages.config import DesiredConfig, DevicePluginConfig, ResourceConfig, Selectors
from tests.integration.agent.test_desired_config import feeding
from tests.support.kubelet import KubeletEmulator
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE = "audit-01"
RESOURCE = "rdma/roce"
# Runs inside the agent process before anything of nicfleet is imported. The log is an
# fd opened before the hook exists and written with os.write, which raises no event.
BOOTSTRAP = r"""
import json, os, sys
LOG = os.open(sys.argv.pop(1), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# event: (indexes of the paths it changes, index of its dir_fd argument or None)
PATH_EVENTS = {"os.mkdir": ((0,), 2), "os.rmdir": ((0,), 1), "os.remove": ((0,), 1),
               "os.chmod": ((0,), 2), "os.chown": ((0,), 3), "os.truncate": ((0,), None),
               "os.utime": ((0,), 3), "os.mkfifo": ((0,), 2), "os.mknod": ((0,), 3),
               "os.rename": ((0, 1), 2), "os.replace": ((0, 1), 2), "os.symlink": ((1,), 2),
               "os.link": ((1,), 3), "shutil.rmtree": ((0,), 1)}

def emit(event, path, extra=None):
    if isinstance(path, int):
        path = f"<fd {path}>"
    else:
        path = os.path.abspath(os.fsdecode(path))
    os.write(LOG, (json.dumps({"event": event, "path": path, "extra": extra}) + "\n").encode())

def hook(event, args):
    if event == "open":
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return  # fdopen of a descriptor whose own open was seen
        if (mode and any(c in mode for c in "wax+")) or (flags or 0) & WRITES:
            emit(event, path, mode or flags)
    elif event in PATH_EVENTS:
        paths, dir_fd = PATH_EVENTS[event]
        for i in paths:
            emit(event, args[i])
        if dir_fd is not None and args[dir_fd] not in (None, -1, -100):  # none, AT_FDCWD
            emit(event + " dir_fd", args[paths[0]], args[dir_fd])
    elif event == "socket.bind":
        address = args[1]
        if isinstance(address, (str, bytes)) and address[:1] not in ("", "\0", b"\0"):
            emit(event, address)
        else:
            os.write(LOG, (json.dumps({"event": event, "path": None,
                                       "extra": repr(address)}) + "\n").encode())

emit("pid", ".", os.getpid())
sys.addaudithook(hook)
from agent.cli import main
main(prog_name="nicfleet-agent")
"""
# Syscalls that create, change or remove a path; openat only with a write flag.
TRACED = (
    "open,openat,creat,mkdir,mkdirat,unlink,unlinkat,rmdir,rename,renameat,renameat2,"
    "chmod,fchmodat,chown,fchownat,lchown,symlink,symlinkat,link,linkat,truncate,"
    "mknod,mknodat,bind"
)
_WRITE_FLAG = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_DIRFD = re.compile(r"^\w+\((\d+|AT_FDCWD)<([^>]*)>")


@dataclass(frozen=True)
class Write:
    event: str
    path: str | None
    extra: object = None


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="aw", dir="/tmp"))  # unix socket path limit
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry below `root` (not following links): a file's mode and bytes, a link's
    target, a directory's mode. The lab's own scratch dirs at the top (.lab-*) are the
    test's doing, not the agent's; the audit checks those paths separately."""
    digest: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        if base == root:
            dirnames[:] = [d for d in dirnames if not d.startswith(".lab-")]
        for name in [*dirnames, *filenames]:
            path = base / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                digest[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                digest[rel] = f"dir {st.st_mode:o}"
            else:
                digest[rel] = f"{st.st_mode:o} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return digest


def desired(generation: int, hca_max: int, kubelet_root_dir: str | None = None) -> bytes:
    resource = ResourceConfig(
        resource_name="roce", rdma_hca_max=hca_max, selectors=Selectors(link_types=("ether",))
    )
    config = DevicePluginConfig(config_list=(resource,), kubelet_root_dir=kubelet_root_dir)
    return encode(DesiredConfig(node=NODE, generation=generation, device_plugin=config))


def audit_log(path: Path) -> list[Write]:
    return [Write(**json.loads(line)) for line in path.read_text().splitlines()]


def strace_writes(prefix: Path) -> list[Write]:
    """Path-changing syscalls from `strace -ff -y` output files (one per thread)."""
    found: list[Write] = []
    for trace in prefix.parent.glob(prefix.name + ".*"):
        for line in trace.read_text(errors="replace").splitlines():
            call = line.split("(", 1)[0]
            if call not in TRACED.split(","):
                continue
            if call in ("open", "openat") and not _WRITE_FLAG.search(line):
                continue
            if call == "bind":
                match = re.search(r'sun_path="([^"]*)"', line)
                found.append(Write(call, os.path.normpath(match[1]) if match else None, line))
                continue
            paths = [p.encode().decode("unicode_escape") for p in _QUOTED.findall(line)]
            dirfd = _DIRFD.match(line)
            for path in paths:
                if not path.startswith("/") and dirfd is not None:
                    path = os.path.join(dirfd[2], path)
                found.append(Write(call, os.path.normpath(path), line))
    return found


def outside(writes: list[Write], allowed: tuple[Path, ...]) -> list[Write]:
    roots = tuple(str(a) for a in allowed)
    return [
        w
        for w in writes
        if w.path is not None and not any(w.path == r or w.path.startswith(r + "/") for r in roots)
    ]


# No bytecode writes: the image is built with compiled modules and a read-only root.
ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}


def audited(short_dir: Path, agent_args: list[str]) -> list[str]:
    """`nicfleet-agent <agent_args>` under the audit hook (log: short_dir/audit.jsonl) and,
    when strace is installed, under strace (per-thread files short_dir/trace/agent.*)."""
    bootstrap, log = short_dir / "bootstrap.py", short_dir / "audit.jsonl"
    bootstrap.write_text(BOOTSTRAP)
    args = [sys.executable, str(bootstrap), str(log), *agent_args]
    strace = shutil.which("strace")
    if strace is None:
        return args
    prefix = short_dir / "trace" / "agent"
    prefix.parent.mkdir(exist_ok=True)
    return [strace, "-f", "-ff", "-qq", "-y", "-s", "512", "--seccomp-bpf",
            "-e", f"trace={TRACED}", "-e", "signal=none", "-o", str(prefix),
            "--", *args]  # fmt: skip


def under(writes: list[Write], root: Path) -> list[Write]:
    return [w for w in writes if w.path is not None and outside([w], (root,)) == []]


def test_the_audit_catches_a_write_to_sysfs(short_dir: Path) -> None:
    """The check of the test below, on a command that does write sysfs (the lab's fault
    injector, same executable): both layers flag it and the tree digest moves."""
    sysfs = short_dir / "sys"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), sysfs)
    before = tree_digest(sysfs)
    args = audited(short_dir, ["lab", "fault", "port-down", "--root", str(sysfs),
                               "--device", "mlx5_0"])  # fmt: skip
    done = subprocess.run(args, env=ENV, cwd=short_dir, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert under(audit_log(short_dir / "audit.jsonl"), sysfs)
    if shutil.which("strace") is not None:
        assert under(strace_writes(short_dir / "trace" / "agent"), sysfs)
    assert tree_digest(sysfs) != before


def agent_pid(log: Path) -> int | None:
    """The pid the bootstrap logged first (None before it ran)."""
    pids = [w.extra for w in audit_log(log) if w.event == "pid"] if log.exists() else []
    return pids[0] if pids and isinstance(pids[0], int) else None


async def stopped(process: asyncio.subprocess.Process, log: Path) -> bytes:
    """SIGTERM to the agent itself (under strace, `process` is strace), as the kubelet
    would; SIGKILL to both if it has not ended within 30 s. Returns its stderr."""
    agent = agent_pid(log) or process.pid
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent, signal.SIGTERM)
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=30)
    except TimeoutError:
        for pid in {agent, process.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await process.wait()
        raise
    return stderr


async def test_the_agent_writes_only_its_sockets_and_cdi_spec_never_sysfs(
    own_nats: NatsServer, short_dir: Path
) -> None:
    sysfs = short_dir / "sys"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), sysfs)
    plugins, registry, cdi = short_dir / "dp", short_dir / "reg", short_dir / "cdi"
    elsewhere = short_dir / "kubelet-elsewhere"
    cwd = short_dir / "cwd"  # relative paths would land here: nothing may
    cwd.mkdir()
    log = short_dir / "audit.jsonl"
    before = tree_digest(sysfs)

    feeds = contextlib.AsyncExitStack()  # the aggregator's side of desired config
    feeder = await feeds.enter_async_context(feeding(own_nats.url))
    await feeder.put_raw(NODE, desired(1, 2))  # before the agent: it asks at start

    args = audited(short_dir, ["run", "--nats-url", own_nats.url,
            "--sysfs-root", str(sysfs), "--node-name", NODE, "--verbs", "off",
            "--device-plugin", "--device-plugin-dir", str(plugins),
            "--plugins-registry-dir", str(registry), "--registration-mode", "watcher",
            "--cdi", "--cdi-dir", str(cdi), "--state-poll-interval", "0.1",
            "--inventory-interval", "1", "--counter-interval", "0.5"])  # fmt: skip
    strace = shutil.which("strace")
    trace_prefix = short_dir / "trace" / "agent"
    process = await asyncio.create_subprocess_exec(
        *args, cwd=cwd, env=ENV, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with KubeletEmulator(plugins, plugins_registry=registry) as kubelet:
            plugin = await kubelet.plugin(RESOURCE, timeout=30)
            await plugin.wait_list(lambda r: len(r.devices) == 2, timeout=30)
            spec = cdi / "nicfleet.io-rdma.json"
            await wait_until(spec.exists, timeout=15, what="the CDI spec")
            first = spec.read_bytes()

            # A desired-config change; its kubeletRootDir (upstream's field) must not move
            # where the agent writes: only the command line chooses directories.
            await feeder.put_raw(NODE, desired(2, 5, str(elsewhere)))
            await plugin.wait_list(lambda r: len(r.devices) == 5, timeout=30)

            port_down(sysfs, "mlx5_1", 1)
            port_up(sysfs, "mlx5_1", 1)
            device_remove(sysfs, "mlx5_1")  # hot-unplug: the CDI spec loses an adapter
            await wait_until(lambda: spec.read_bytes() != first, timeout=30,
                             what="the CDI spec rewritten")  # fmt: skip
            device_add(sysfs, "mlx5_1")
            await wait_until(lambda: spec.read_bytes() == first, timeout=30,
                             what="the CDI spec back")  # fmt: skip
    finally:
        try:
            stderr = await stopped(process, log)
        finally:
            await feeds.aclose()
    assert process.returncode == 0, stderr.decode()[-2000:]

    allowed = (plugins, registry, cdi)
    writes = [w for w in audit_log(log) if w.event != "pid"]
    assert writes, "the audit hook saw nothing: it is not installed"
    assert {w.path for w in writes if w.event == "os.rename"} >= {str(spec)}
    assert not [w for w in writes if w.event.endswith("dir_fd")], "an fd-relative write"
    assert outside(writes, allowed) == []
    # The regression this guards: no write of any kind below the sysfs root.
    assert under(writes, sysfs) == []
    # Binds without a path (netlink's (pid, groups), a TCP (host, port)) put nothing on disk.
    assert all(str(w.extra).startswith("(") for w in writes if w.event == "socket.bind"
               and w.path is None)  # fmt: skip

    if strace is not None:
        # The one write of the harness itself: the bootstrap opening the audit log.
        syscalls = [w for w in strace_writes(trace_prefix) if w.path != str(log)]
        binds = {w.path for w in syscalls if w.event == "bind" and w.path}
        assert str(plugins / "nicfleet-rdma_roce.sock") in binds  # the layer sees gRPC's C
        assert outside(syscalls, allowed) == []
        assert under(syscalls, sysfs) == []

    assert not elsewhere.exists()
    assert not any(cwd.iterdir())
    assert tree_digest(sysfs) == before
    assert not any((sysfs / STASH).iterdir())  # the lab's scratch is empty again


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("../../etc/cron.d/x", "rdma"),
        ("roce", "../../etc"),
        ("/etc/passwd", "rdma"),
        ("..", "rdma"),
        ("roce", "a/b"),
        ("ro\x00ce", "rdma"),
        ("roce", ".."),
    ],
)
def test_a_config_naming_a_path_is_refused(name: str, prefix: str) -> None:
    """The resource name is the one config value that becomes a file name (the plugin's
    socket): the validator refuses every name that is not a single safe component."""
    resource = ResourceConfig(resource_name=name, resource_prefix=prefix, rdma_hca_max=1,
                              selectors=Selectors(vendors=("15b3",)))  # fmt: skip
    with pytest.raises(ConfigError, match=r"resourceName|resourcePrefix"):
        validate_device_plugin_config(DevicePluginConfig(config_list=(resource,)), source="kv")


@settings(max_examples=300, deadline=None)
@given(name=st.text(max_size=70), prefix=st.text(max_size=40) | st.just("rdma"))
def test_every_accepted_resource_names_a_socket_inside_the_plugin_dir(
    name: str, prefix: str
) -> None:
    resource = ResourceConfig(resource_name=name, resource_prefix=prefix, rdma_hca_max=1,
                              selectors=Selectors(vendors=("15b3",)))  # fmt: skip
    try:
        validate_device_plugin_config(DevicePluginConfig(config_list=(resource,)), source="kv")
    except ConfigError:
        return
    socket = socket_name(resource_full_name(resource))
    assert "/" not in socket and "\x00" not in socket and socket not in (".", "..")
    assert (Path("/plugins") / socket).parent == Path("/plugins")
