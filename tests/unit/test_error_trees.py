"""The exception trees of agent, aggregator and proto: the drawing in each package's
errors.py is the code's tree; every exception a package defines derives from its root;
`retryable` is what the drawing says; no exception class name is used twice in agent,
aggregator and proto."""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.errortree import PACKAGES, defined_exceptions, drawn_parent, drawn_tree


@dataclass(frozen=True)
class Tree:
    package: str
    root_name: str
    outside: frozenset[str] = frozenset()  # defined outside the tree on purpose

    @property
    def root(self) -> Any:
        return getattr(importlib.import_module(f"{self.package}.errors"), self.root_name)

    @property
    def drawn(self) -> dict[str, Any]:
        doc = importlib.import_module(f"{self.package}.errors").__doc__ or ""
        return drawn_tree(doc, self.root_name)

    @property
    def classes(self) -> dict[str, Any]:
        return {cls.__name__: cls for cls in defined_exceptions(self.package)}


TREES = (
    # ReadAbandoned is a BaseException on purpose (agent.host.deadlines).
    Tree("agent", "AgentError", frozenset({"ReadAbandoned"})),
    Tree("aggregator", "AggregatorError"),
    Tree("proto", "ProtoError"),
)
BY_PACKAGE = pytest.mark.parametrize("tree", TREES, ids=lambda t: t.package)
DRAWN_CLASSES = [
    pytest.param(tree, name, id=f"{tree.package}:{name}")
    for tree in TREES
    for name in sorted(tree.drawn)
]


@BY_PACKAGE
def test_the_drawing_names_every_class_of_the_tree(tree: Tree) -> None:
    in_tree = {name for name, cls in tree.classes.items() if issubclass(cls, tree.root)}
    assert in_tree - {tree.root_name} == set(tree.drawn)


@BY_PACKAGE
def test_every_exception_of_the_package_is_in_the_tree(tree: Tree) -> None:
    outside = {name for name, cls in tree.classes.items() if not issubclass(cls, tree.root)}
    assert outside == tree.outside


@pytest.mark.parametrize(("tree", "name"), DRAWN_CLASSES)
def test_each_class_sits_where_it_is_drawn(tree: Tree, name: str) -> None:
    drawn = tree.drawn
    assert drawn_parent(tree.classes[name], set(drawn) | {tree.root_name}) == drawn[name].parent


@pytest.mark.parametrize(("tree", "name"), DRAWN_CLASSES)
def test_retryable_is_what_the_drawing_says(tree: Tree, name: str) -> None:
    cls = tree.classes[name]
    assert issubclass(cls, tree.root)
    assert cls.retryable is tree.drawn[name].retryable


@BY_PACKAGE
def test_the_root_is_permanent_and_a_class_line_can_say_otherwise(tree: Tree) -> None:
    root = tree.root

    class Permanent(root):  # type: ignore[misc, valid-type]
        pass

    class Retryable(root, retryable=True):  # type: ignore[misc, valid-type, call-arg]
        pass

    class Again(Retryable):
        pass

    class NotAgain(Retryable, retryable=False):  # type: ignore[call-arg]
        pass

    assert not root.retryable and not Permanent().retryable
    assert Retryable().retryable and Again.retryable
    assert not NotAgain.retryable


@BY_PACKAGE
def test_no_two_exception_classes_share_a_name(tree: Tree) -> None:
    names = Counter(cls.__name__ for package in PACKAGES for cls in defined_exceptions(package))
    ours = {cls.__name__ for cls in tree.classes.values()}
    assert {name: n for name, n in names.items() if n > 1 and name in ours} == {}
