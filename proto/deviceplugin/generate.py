"""Regenerate the committed gRPC stubs of proto/deviceplugin with grpcio-tools.

Runs protoc with the repository root as the only include path, so the generated modules
import each other package-qualified (`from proto.deviceplugin import api_pb2`), while the
wire names still come from each file's `package` (`/v1beta1.DevicePlugin/Allocate`).
Usage: `python proto/deviceplugin/generate.py [OUT_ROOT]` (default: the repository root).
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]
PROTOS = ("api.proto", "pluginregistration.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_files(out_root: Path) -> list[Path]:
    """Every file a generation into `out_root` writes, in a stable order."""
    target = out_root / PACKAGE_DIR.relative_to(REPO_ROOT)
    stems = [Path(p).stem for p in PROTOS]
    return [target / f"{stem}{suffix}" for stem in stems for suffix in GENERATED_SUFFIXES]


def generate(out_root: Path) -> list[Path]:
    """Write the stubs below `out_root`/proto/deviceplugin/; returns the files written."""
    out_root = Path(out_root).resolve()
    (out_root / PACKAGE_DIR.relative_to(REPO_ROOT)).mkdir(parents=True, exist_ok=True)
    relative = [str((PACKAGE_DIR / p).relative_to(REPO_ROOT)) for p in PROTOS]
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *relative,
    ]
    # protoc resolves the .proto paths against -I; run from the root so they match.
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return generated_files(out_root)


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT
    for path in generate(root):
        print(path)
