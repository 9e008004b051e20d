"""Where the tests find the repository and its captured data (nothing outside it)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Real captured trees and their reference values, kept in the repo (tests/data/*/README.md).
FIXTURES = REPO / "tests" / "data"
