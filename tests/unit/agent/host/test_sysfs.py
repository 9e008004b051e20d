"""The sysfs reader on small trees built in tmp_path: errno names, links kept in the root,
only regular files read and only so much of them, and the time bound on blocked reads."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import CollectionTimeout, ParseError, ReadErrorLog, ReadFailed, SysfsRootError
from agent.host.sysfs import ABSENT, MAX_ATTRIBUTE_BYTES, Sysfs, errno_name, read_value
from proto.inventory import ReadError
from tests.support.sysfs_trees import BlockingSysfs, released
from tests.support.sysfs_trees import link as _link
from tests.support.sysfs_trees import write as _write


def _loop(root: Path, a: str, b: str) -> None:
    _link(root, a, b.rsplit("/", 1)[-1])
    _link(root, b, a.rsplit("/", 1)[-1])


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tiny sysfs: one RDMA device reached through class/ -> devices/ links."""
    root = tmp_path / "sys"
    dev = "devices/pci0000:00/0000:00:01.0/0000:3b:00.0"
    _write(root, f"{dev}/vendor", "0x15b3\n")
    _write(root, f"{dev}/infiniband/mlx5_0/fw_ver", "20.35.1012\n")
    _write(root, "bus/pci/drivers/mlx5_core/bind", "")
    _link(root, f"{dev}/driver", "../../../../bus/pci/drivers/mlx5_core")
    _link(root, f"{dev}/infiniband/mlx5_0/device", "../../../0000:3b:00.0")
    _link(root, "class/infiniband/mlx5_0", f"../../{dev}/infiniband/mlx5_0")
    return root


def test_reads_text_through_links(tree: Path) -> None:
    sysfs = Sysfs(tree)
    assert sysfs.read_text("class/infiniband/mlx5_0/fw_ver") == "20.35.1012\n"
    assert sysfs.read_text("/class/infiniband/mlx5_0/device/vendor") == "0x15b3\n"


def test_dir_realpath_and_link_name(tree: Path) -> None:
    sysfs = Sysfs(tree)
    device = sysfs.dir("class/infiniband/mlx5_0/device")
    assert device.realpath == "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0"
    assert device.link_name("driver") == "mlx5_core"


def test_list_dir_is_sorted(tree: Path) -> None:
    _write(tree, "class/net/b/x", "")
    _write(tree, "class/net/a/x", "")
    assert Sysfs(tree).list_dir("class/net") == ["a", "b"]


@pytest.mark.parametrize(
    ("setup", "path", "error"),
    [
        pytest.param(lambda r: None, "class/infiniband/mlx5_0/nope", "ENOENT", id="missing"),
        pytest.param(
            lambda r: (r / "class/infiniband_verbs/uverbs0/ibdev").mkdir(parents=True),
            "class/infiniband_verbs/uverbs0/ibdev",
            "EISDIR",
            id="directory-where-file-expected",
        ),
        pytest.param(
            lambda r: _link(r, "class/misc/rdma_cm", "../../devices/virtual/misc/rdma_cm"),
            "class/misc/rdma_cm/dev",
            "ENOENT",
            id="dangling-link",
        ),
        pytest.param(
            lambda r: _write(r, "module/ib_core", "not a dir\n"),
            "module/ib_core/version",
            "ENOTDIR",
            id="file-where-dir-expected",
        ),
        pytest.param(
            lambda r: _loop(r, "class/a", "class/b"),
            "class/a/x",
            "ELOOP",
            id="link-loop",
        ),
    ],
)
def test_read_errors_carry_errno_name_and_asked_path(
    tree: Path, setup: Callable[[Path], object], path: str, error: str
) -> None:
    setup(tree)
    with pytest.raises(ReadFailed) as info:
        Sysfs(tree).read_text(path)
    assert info.value.error == error
    assert info.value.path == "/" + path
    assert info.value.to_read_error() == ReadError(path="/" + path, error=error)


def test_link_escaping_the_root_stays_inside(tmp_path: Path, tree: Path) -> None:
    secret = _write(tmp_path, "outside/secret", "do not read\n")
    _link(tree, "class/net/abs", str(secret))
    _link(tree, "class/net/rel", "../../../../../../../outside/secret")
    sysfs = Sysfs(tree)
    for name in ("abs", "rel"):
        with pytest.raises(ReadFailed) as info:
            sysfs.read_text(f"class/net/{name}")
        assert info.value.error == "ENOENT"
    # `..` above the root stays at the root, as in a chroot.
    assert sysfs.dir("class/../../../devices").realpath == "/devices"


def test_absolute_sys_link_is_resolved_against_the_root(tree: Path) -> None:
    # Captured trees keep absolute links; their /sys stands for the root.
    _link(tree, "class/infiniband/mlx5_1", "/sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.0")
    _link(tree, "class/infiniband/mlx5_2", "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0")
    sysfs = Sysfs(tree)
    assert sysfs.read_text("class/infiniband/mlx5_1/vendor") == "0x15b3\n"
    assert sysfs.read_text("class/infiniband/mlx5_2/vendor") == "0x15b3\n"


def test_dangling_link_reads_as_absent(tree: Path) -> None:
    dev = "devices/pci0000:00/0000:00:01.0/0000:3b:00.0"
    (tree / f"{dev}/driver").unlink()
    _link(tree, f"{dev}/driver", "../../../../bus/pci/drivers/gone")
    sysfs = Sysfs(tree)
    with pytest.raises(ReadFailed) as info:
        sysfs.dir(dev).link_name("driver")
    assert (info.value.path, info.value.error) == (f"/{dev}/driver", "ENOENT")
    assert not sysfs.exists(f"{dev}/driver")


def test_link_name_of_a_non_link_is_einval(tree: Path) -> None:
    with pytest.raises(ReadFailed) as info:
        Sysfs(tree).dir("class/infiniband/mlx5_0").link_name("fw_ver")
    assert info.value.error == "EINVAL"


def test_list_dir_errors(tree: Path) -> None:
    sysfs = Sysfs(tree)
    with pytest.raises(ReadFailed) as info:
        sysfs.list_dir("class/infiniband_verbs")
    assert info.value.error == "ENOENT"
    with pytest.raises(ReadFailed) as info:
        sysfs.list_dir("class/infiniband/mlx5_0/fw_ver")
    assert info.value.error == "ENOTDIR"


def test_exists(tree: Path) -> None:
    sysfs = Sysfs(tree)
    assert sysfs.exists("class/infiniband/mlx5_0/fw_ver")
    assert sysfs.exists("class/infiniband/mlx5_0")
    assert not sysfs.exists("class/infiniband/mlx5_9")


def test_error_log_keeps_first_error_and_sorts() -> None:
    log = ReadErrorLog()
    log.record("/b", "EIO")
    log.record("/a", "ENOENT")
    log.record("/b", "EACCES")
    assert "/a" in log
    assert log.to_tuple() == (
        ReadError(path="/a", error="ENOENT"),
        ReadError(path="/b", error="EIO"),
    )


def test_dir_reads_files_below_it_and_names_them_as_asked(tree: Path) -> None:
    device = Sysfs(tree).dir("class/infiniband/mlx5_0")
    assert device.path == "/class/infiniband/mlx5_0"
    assert device.realpath == "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband/mlx5_0"
    assert device.read("fw_ver") == "20.35.1012\n"
    pci = device.child("device")
    assert (pci.path, pci.parts[-1]) == ("/class/infiniband/mlx5_0/device", "0000:3b:00.0")
    assert pci.link_name("driver") == "mlx5_core"
    assert pci.ancestor(1).path == "/devices/pci0000:00/0000:00:01.0"
    with pytest.raises(ReadFailed) as info:
        pci.read("nope")
    assert (info.value.path, info.value.error) == ("/class/infiniband/mlx5_0/device/nope", "ENOENT")


@pytest.mark.parametrize(
    ("quiet", "recorded"),
    [
        pytest.param(frozenset(), True, id="missing-is-recorded"),
        pytest.param(ABSENT, False, id="absent-ok-attribute"),
    ],
)
def test_read_value_records_or_not(tree: Path, quiet: frozenset[str], recorded: bool) -> None:
    log = ReadErrorLog()
    device = Sysfs(tree).dir("class/infiniband/mlx5_0")
    assert read_value(device, "hca_type", str.strip, log, quiet=quiet) is None
    assert ("/class/infiniband/mlx5_0/hca_type" in log) is recorded


def test_read_value_records_what_did_not_parse(tree: Path) -> None:
    def fail(text: str) -> str:
        raise ParseError("fw", text)

    log = ReadErrorLog()
    assert read_value(Sysfs(tree).dir("class/infiniband/mlx5_0"), "fw_ver", fail, log) is None
    assert log.get("/class/infiniband/mlx5_0/fw_ver") == "unparsable: '20.35.1012'"


def test_fifo_is_refused_without_blocking(tree: Path) -> None:
    # Opening a FIFO for reading waits for a writer; O_NONBLOCK plus the type check
    # answer at once. pytest-timeout would end this test if it blocked.
    os.mkfifo(tree / "class/infiniband/mlx5_0/board_id")
    sysfs = Sysfs(tree)
    with pytest.raises(ReadFailed) as info:
        sysfs.read_text("class/infiniband/mlx5_0/board_id")
    assert info.value.error == "not a regular file"
    host = sysfs.dir("class/infiniband/mlx5_0").host + "/board_id"
    with pytest.raises(ReadFailed, match="not a regular file"):
        sysfs.open_file(host, "/board_id")


def test_oversize_file_is_efbig(tree: Path) -> None:
    _write(tree, "class/infiniband/mlx5_0/hca_type", "x" * (MAX_ATTRIBUTE_BYTES + 1))
    _write(tree, "class/infiniband/mlx5_0/hw_rev", "x" * MAX_ATTRIBUTE_BYTES)
    sysfs = Sysfs(tree)
    with pytest.raises(ReadFailed) as info:
        sysfs.read_text("class/infiniband/mlx5_0/hca_type")
    assert info.value.error == "EFBIG"
    assert len(sysfs.read_text("class/infiniband/mlx5_0/hw_rev")) == MAX_ATTRIBUTE_BYTES


def test_pread_rereads_an_open_file_and_bounds_it(tree: Path) -> None:
    sysfs = Sysfs(tree)
    host = sysfs.dir("class/infiniband/mlx5_0").host + "/fw_ver"
    fd = sysfs.open_file(host, "/fw_ver")
    try:
        assert sysfs.pread(fd, "/fw_ver", 64) == b"20.35.1012\n"
        with open(host, "r+") as f:  # rewrite the same inode, as show() would
            f.write("22")
        assert sysfs.pread(fd, "/fw_ver", 64) == b"22.35.1012\n"
        with pytest.raises(ReadFailed, match="EFBIG"):
            sysfs.pread(fd, "/fw_ver", 5)
    finally:
        os.close(fd)


def test_run_bounded_inline_and_in_a_thread(tree: Path) -> None:
    sysfs = Sysfs(tree)
    assert sysfs.run_bounded(lambda: threading.current_thread().name, timeout=None) == (
        threading.current_thread().name
    )
    assert sysfs.run_bounded(lambda: threading.current_thread().name, timeout=5) == (
        "nicfleet-sysfs"
    )

    def boom() -> None:
        raise ValueError("from the worker")

    with pytest.raises(ValueError, match="from the worker"):
        sysfs.run_bounded(boom, timeout=5)


def test_a_blocked_read_costs_one_file_not_the_collection(tree: Path) -> None:
    with released(BlockingSysfs(tree, "/fw_ver")) as sysfs:

        def collect() -> dict[str, str]:
            log = ReadErrorLog()
            device = sysfs.dir("class/infiniband/mlx5_0")
            vendor = read_value(device.child("device"), "vendor", str.strip, log)
            fw = read_value(device, "fw_ver", str.strip, log)
            return {"vendor": str(vendor), "fw": str(fw), "fw_error": str(log.get(fw_path))}

        fw_path = "/class/infiniband/mlx5_0/fw_ver"
        result = sysfs.run_bounded(collect, timeout=1.0)  # vendor must be read within it
        assert result == {"vendor": "0x15b3", "fw": "None", "fw_error": "ETIMEDOUT"}
        # While the stuck read has not returned, the path answers ETIMEDOUT at once.
        assert sysfs.run_bounded(collect, timeout=5) == result
    # Once it returned, the file is read again.
    assert Sysfs(tree).read_text(fw_path) == "20.35.1012\n"
    assert sysfs.run_bounded(collect, timeout=5)["fw"] == "20.35.1012"


def test_reads_that_keep_blocking_end_in_collection_timeout(tree: Path) -> None:
    for name in ("hca_type", "board_id"):
        _write(tree, f"class/infiniband/mlx5_0/{name}", "x\n")
    with released(BlockingSysfs(tree, "")) as sysfs:  # every read blocks
        names = iter(["fw_ver", "hca_type", "board_id", "node_guid", "hw_rev"])

        def collect() -> str:
            return sysfs.read_text(f"class/infiniband/mlx5_0/{next(names)}")

        with pytest.raises(CollectionTimeout) as info:
            sysfs.run_bounded(collect, timeout=0.05, retries=2)
        assert info.value.error == "ETIMEDOUT"
        assert info.value.path == "/class/infiniband/mlx5_0/board_id"  # the third attempt's


def test_absolute_link_out_of_the_root_is_walked_not_followed(tmp_path: Path, tree: Path) -> None:
    # The kernel would follow /sys/... to the host's own /sys; the walk maps it to the root.
    _link(tree, "class/infiniband/mlx5_7", "/sys/class/infiniband/mlx5_0")
    device = Sysfs(tree).dir("class/infiniband/mlx5_7")
    assert device.read("fw_ver") == "20.35.1012\n"
    assert device.realpath.startswith("/devices/pci0000:00/")


@pytest.mark.parametrize(
    ("code", "name"),
    [
        pytest.param(errno.EACCES, "EACCES", id="eacces"),
        pytest.param(errno.ENODEV, "ENODEV", id="enodev"),
        pytest.param(errno.EOPNOTSUPP, "EOPNOTSUPP", id="eopnotsupp-not-enotsup"),
        pytest.param(errno.EINVAL, "EINVAL", id="einval"),
        pytest.param(None, "EIO", id="no-errno"),
    ],
)
def test_errno_name(code: int | None, name: str) -> None:
    exc = OSError(code, "x") if code is not None else OSError("x")
    assert errno_name(exc) == name


def test_missing_root_is_a_permanent_root_error(tmp_path: Path) -> None:
    with pytest.raises(SysfsRootError, match="does not exist"):
        Sysfs(tmp_path / "nope")


def test_root_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SysfsRootError, match="not a directory"):
        Sysfs(_write(tmp_path, "file", ""))


def test_root_that_is_not_a_sysfs_tree_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(SysfsRootError, match="class/"):
        Sysfs(tmp_path)
