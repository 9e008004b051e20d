"""The verbs probe against the real rdma-core binding and against stand-in packages.

Every probe runs in a fresh interpreter: loading pyverbs (or a stand-in) is
process-wide, so one probe must not see what another one imported. The real-library
tests skip with the reason when Debian's `python3-pyverbs` is not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.integration

# Debian's python3-pyverbs (rdma-core) installs here, for the system Python 3.11.
DEBIAN_DIST = Path("/usr/lib/python3/dist-packages")
SYSTEM_PYTHON = Path("/usr/bin/python3")
NO_RDMA_DEVICES = not any(Path("/sys/class/infiniband").glob("*"))

requires_debian_pyverbs = pytest.mark.skipif(
    not (DEBIAN_DIST / "pyverbs").is_dir(),
    reason="pyverbs not importable: install Debian's python3-pyverbs "
    "(apt-get install -y --no-install-recommends python3-pyverbs)",
)


def probe(python: Path | str, search_path: Path | None) -> str:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from agent.host.verbs import probe_verbs
        path = {str(search_path) if search_path else None!r}
        print(probe_verbs(search_path=Path(path) if path else None))
        print("pyverbs from", getattr(sys.modules.get("pyverbs"), "__file__", None))
        print("yaml loaded", "yaml" in sys.modules)
        """
    )
    done = subprocess.run(
        [str(python), "-I", "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@requires_debian_pyverbs
def test_real_pyverbs_loaded_into_the_venv_from_the_debian_directory() -> None:
    out = probe(sys.executable, DEBIAN_DIST).splitlines()
    if NO_RDMA_DEVICES:
        assert out[0] == "verbs unavailable: Failed to get devices list"
    else:
        assert out[0].startswith("ok: ")
    assert out[1] == f"pyverbs from {DEBIAN_DIST / 'pyverbs' / '__init__.py'}"
    # Only pyverbs came from there: nothing else of Debian's leaked into the venv.
    assert out[2] == "yaml loaded False"


@requires_debian_pyverbs
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no system Python at /usr/bin/python3")
def test_real_pyverbs_under_the_system_python_needs_no_path() -> None:
    # How a Debian-based agent image runs it: pyverbs on the ordinary import path.
    first = probe(SYSTEM_PYTHON, None).splitlines()[0]
    assert first.startswith("ok: ") or first.startswith("verbs unavailable: Failed to get")


def test_not_installed() -> None:
    assert probe(sys.executable, None).splitlines()[0] == "verbs unavailable: pyverbs not installed"


def test_search_path_without_pyverbs_is_not_installed(tmp_path: Path) -> None:
    first = probe(sys.executable, tmp_path).splitlines()[0]
    assert first == "verbs unavailable: pyverbs not installed"


def fake_pyverbs(root: Path, get_device_list: str, *, init: str = "") -> Path:
    package = root / "pyverbs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "pyverbs_error.py").write_text(
        "class PyverbsError(Exception):\n    pass\n\n"
        "class PyverbsRDMAError(PyverbsError):\n    pass\n"
    )
    (package / "device.py").write_text(
        "from pyverbs.pyverbs_error import PyverbsRDMAError\n\n"
        f"def get_device_list():\n    {get_device_list}\n"
    )
    return root


@pytest.mark.parametrize(
    ("body", "init", "expected"),
    [
        pytest.param("return ['mlx5_0', 'mlx5_1']", "", "ok: 2 devices", id="two-devices"),
        pytest.param("return []", "", "ok: 0 devices", id="no-devices-but-no-error"),
        pytest.param(
            "raise PyverbsRDMAError('Failed to get devices list')",
            "",
            "verbs unavailable: Failed to get devices list",
            id="rdma-error",
        ),
        pytest.param(
            "raise PermissionError(13, 'Permission denied')",
            "",
            "verbs unavailable: [Errno 13] Permission denied",
            id="os-error",
        ),
        pytest.param(
            "return []",
            "raise ImportError('libibverbs.so.1: cannot open shared object file')",
            "verbs unavailable: pyverbs cannot be imported: "
            "libibverbs.so.1: cannot open shared object file",
            id="broken-binding",
        ),
    ],
)
def test_probe_answers(tmp_path: Path, body: str, init: str, expected: str) -> None:
    path = fake_pyverbs(tmp_path, body, init=init)
    assert probe(sys.executable, path).splitlines()[0] == expected
