"""The classes `claim explain` knows are the ones deploy/dra ships."""

from __future__ import annotations

import yaml

from aggregator.dra import builtin
from aggregator.dra.objects import parse_class
from tests.support.paths import REPO


def test_builtin_classes_equal_the_manifest() -> None:
    text = (REPO / "deploy" / "dra" / "deviceclasses.yaml").read_text()
    shipped = [parse_class(doc) for doc in yaml.safe_load_all(text) if doc]
    assert shipped == list(builtin.CLASSES)
