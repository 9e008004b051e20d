"""Everything under tests/integration starts real servers, sockets or processes: marked
`integration` here, so `pytest -m "not integration"` runs the pure unit tests alone."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)
