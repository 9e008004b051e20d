"""Regenerate the committed kubelet gRPC stubs (proto/deviceplugin, proto/dra) with grpcio-tools.

Runs protoc with the repository root as the only include path, so the generated modules
import each other package-qualified (`from proto.deviceplugin import api_pb2`), while the
wire names still come from each file's `package` (`/v1beta1.DevicePlugin/Allocate`,
`/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`).
Usage: `python proto/stubgen.py [OUT_ROOT]` (default: the repository root).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from grpc_tools import protoc  # type: ignore[import-untyped]

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
# Each .proto, relative to the repository root; the DRA plugin registers through the same
# plugin-watcher service as the device plugin's watcher mode, so pluginregistration is shared.
PROTOS: Final = (
    "proto/deviceplugin/api.proto",
    "proto/deviceplugin/pluginregistration.proto",
    "proto/dra/api.proto",
    "proto/dra/health.proto",
    "proto/dra/healthv1alpha1.proto",
)
GENERATED_SUFFIXES: Final = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_files(out_root: Path) -> list[Path]:
    """Every file a generation into `out_root` writes, in a stable order."""
    return [
        out_root / Path(proto).with_name(f"{Path(proto).stem}{suffix}")
        for proto in PROTOS
        for suffix in GENERATED_SUFFIXES
    ]


def generate(out_root: Path) -> list[Path]:
    """Write the stubs below `out_root` (same relative paths); returns the files written."""
    out_root = Path(out_root).resolve()
    for proto in PROTOS:
        (out_root / proto).parent.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *PROTOS,
    ]
    # protoc resolves the .proto paths against -I; they are given relative to the root.
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    return generated_files(out_root)


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT
    for path in generate(root):
        print(path)
