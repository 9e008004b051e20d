"""The sysfs reader on small trees built in tmp_path: errno names, links kept in the root."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import ReadFailed, SysfsRootError
from agent.sysfs import ReadErrorLog, Sysfs, errno_name
from proto.inventory import ReadError


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _link(root: Path, rel: str, target: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


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


def test_realpath_and_link_name(tree: Path) -> None:
    sysfs = Sysfs(tree)
    assert (
        sysfs.realpath("class/infiniband/mlx5_0/device")
        == "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0"
    )
    assert sysfs.link_name("class/infiniband/mlx5_0/device/driver") == "mlx5_core"


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
    assert sysfs.realpath("class/../../../devices") == "/devices"


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
        sysfs.link_name(f"{dev}/driver")
    assert info.value.error == "ENOENT"
    assert not sysfs.exists(f"{dev}/driver")


def test_link_name_of_a_non_link_is_einval(tree: Path) -> None:
    with pytest.raises(ReadFailed) as info:
        Sysfs(tree).link_name("class/infiniband/mlx5_0/fw_ver")
    assert info.value.error == "EINVAL"


def test_list_dir_errors(tree: Path) -> None:
    sysfs = Sysfs(tree)
    with pytest.raises(ReadFailed) as info:
        sysfs.list_dir("class/infiniband_verbs")
    assert info.value.error == "ENOENT"
    with pytest.raises(ReadFailed) as info:
        sysfs.list_dir("class/infiniband/mlx5_0/fw_ver")
    assert info.value.error == "ENOTDIR"


def test_exists_and_is_dir(tree: Path) -> None:
    sysfs = Sysfs(tree)
    assert sysfs.exists("class/infiniband/mlx5_0/fw_ver")
    assert not sysfs.is_dir("class/infiniband/mlx5_0/fw_ver")
    assert sysfs.is_dir("class/infiniband/mlx5_0")
    assert not sysfs.exists("class/infiniband/mlx5_9")


def test_read_optional_records_and_returns_none(tree: Path) -> None:
    sysfs = Sysfs(tree)
    log = ReadErrorLog()
    assert sysfs.read_optional("class/infiniband/mlx5_0/hca_type", log) is None
    assert sysfs.read_optional("class/infiniband/mlx5_0/fw_ver", log) == "20.35.1012\n"
    assert log.get("/class/infiniband/mlx5_0/hca_type") == "ENOENT"
    assert len(log) == 1


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


def test_read_resolved_names_the_asked_path(tree: Path) -> None:
    sysfs = Sysfs(tree)
    host = sysfs.resolve("class/infiniband/mlx5_0/fw_ver")
    assert sysfs.read_resolved(host, "class/infiniband/mlx5_0/fw_ver") == "20.35.1012\n"
    host.unlink()
    with pytest.raises(ReadFailed) as info:
        sysfs.read_resolved(host, "class/infiniband/mlx5_0/fw_ver")
    assert (info.value.path, info.value.error) == ("/class/infiniband/mlx5_0/fw_ver", "ENOENT")


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
