"""Read the exception tree drawn in an errors.py docstring and the classes the code defines.

The tree is the box-drawing picture under a root name (`├── Name  comment`, nested by four
columns); a name followed by "(retryable)" in its comment is one whose `retryable` is True.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Final

PACKAGES: Final = ("agent", "aggregator", "proto")
_BRANCH: Final = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)(?P<rest>.*)$")


@dataclass(frozen=True)
class Drawn:
    name: str
    parent: str
    retryable: bool


def drawn_tree(docstring: str, root: str) -> dict[str, Drawn]:
    """Every class drawn under `root`, by name, with its drawn parent."""
    lines = docstring.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == root)
    base = len(lines[start]) - len(lines[start].lstrip())
    drawn: dict[str, Drawn] = {}
    stack = [root]  # stack[d] is the last name drawn at depth d
    for line in lines[start + 1 :]:
        match = _BRANCH.match(line[base:])
        if match is None:
            break
        depth = len(match["indent"]) // 4 + 1
        del stack[depth:]
        drawn[match["name"]] = Drawn(match["name"], stack[-1], "(retryable)" in match["rest"])
        stack.append(match["name"])
    return drawn


def modules(package: str) -> list[ModuleType]:
    """Every module of `package`, imported (`__main__` modules run a CLI: skipped)."""
    root = importlib.import_module(package)
    names = [package] + [
        info.name
        for info in pkgutil.walk_packages(root.__path__, f"{package}.")
        if not info.name.endswith("__main__")
    ]
    return [importlib.import_module(name) for name in names]


def defined_exceptions(package: str) -> list[type[BaseException]]:
    """Every exception class defined (not imported) at module level in `package`, once each
    (an alias, or a module another test re-imported, holds the same module and name)."""
    found: dict[tuple[str, str], type[BaseException]] = {}
    for module in modules(package):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found.setdefault((value.__module__, value.__qualname__), value)
    return list(found.values())


def drawn_parent(cls: type[BaseException], names: set[str]) -> str:
    """The nearest class in `cls`'s MRO (after itself) whose name is drawn."""
    return next(base.__name__ for base in cls.__mro__[1:] if base.__name__ in names)
