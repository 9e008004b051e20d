"""The test data of tests/data/dra are objects a Kubernetes 1.37 API server accepts, so
the explainer is tested on the real shapes."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.paths import FIXTURES

KUBERNETES_VERSION = "1.37"  # the schemas kubernetes-validate 1.37.0 ships
FILES = sorted((FIXTURES / "dra").glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_object_validates(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        for obj in doc["items"] if doc["kind"] == "List" else [doc]:
            found = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            assert found == KUBERNETES_VERSION
