"""The agent exception tree: the drawing in agent/errors.py is the code's tree; every
exception agent defines derives from AgentError; `retryable` is what the drawing says; no
exception class name is used twice in agent, aggregator and proto."""

from __future__ import annotations

from collections import Counter

import pytest

import agent.errors
from agent.errors import AgentError
from tests.support.errortree import (
    PACKAGES,
    defined_exceptions,
    drawn_parent,
    drawn_tree,
)

DRAWN = drawn_tree(agent.errors.__doc__ or "", "AgentError")
CLASSES = {cls.__name__: cls for cls in defined_exceptions("agent")}
OUTSIDE = {"ReadAbandoned"}  # a BaseException on purpose (agent.host.deadlines)


def test_the_drawing_names_every_class_of_the_tree() -> None:
    in_tree = {name for name, cls in CLASSES.items() if issubclass(cls, AgentError)}
    assert in_tree - {"AgentError"} == set(DRAWN)


def test_every_exception_of_the_package_is_in_the_tree() -> None:
    outside = {name for name, cls in CLASSES.items() if not issubclass(cls, AgentError)}
    assert outside == OUTSIDE


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_each_class_sits_where_it_is_drawn(name: str) -> None:
    assert drawn_parent(CLASSES[name], set(DRAWN) | {"AgentError"}) == DRAWN[name].parent


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_retryable_is_what_the_drawing_says(name: str) -> None:
    cls = CLASSES[name]
    assert issubclass(cls, AgentError)
    assert cls.retryable is DRAWN[name].retryable


def test_the_root_is_permanent_and_a_class_line_can_say_otherwise() -> None:
    class Permanent(AgentError):
        pass

    class Retryable(AgentError, retryable=True):
        pass

    class Again(Retryable):
        pass

    class NotAgain(Retryable, retryable=False):
        pass

    assert not AgentError.retryable and not Permanent().retryable
    assert Retryable().retryable and Again.retryable
    assert not NotAgain.retryable


def test_no_two_exception_classes_share_a_name() -> None:
    names = Counter(cls.__name__ for package in PACKAGES for cls in defined_exceptions(package))
    ours = {cls.__name__ for cls in CLASSES.values()}
    assert {name: n for name, n in names.items() if n > 1 and name in ours} == {}
