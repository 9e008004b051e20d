"""The proto exception tree: the drawing in proto/errors.py is the code's tree; every
exception proto defines derives from ProtoError; `retryable` is what the drawing says; no
exception class name is used twice in agent, aggregator and proto."""

from __future__ import annotations

from collections import Counter

import pytest

import proto.errors
from proto.errors import ProtoError
from tests.support.errortree import (
    PACKAGES,
    defined_exceptions,
    drawn_parent,
    drawn_tree,
)

DRAWN = drawn_tree(proto.errors.__doc__ or "", "ProtoError")
CLASSES = {cls.__name__: cls for cls in defined_exceptions("proto")}
OUTSIDE: set[str] = set()


def test_the_drawing_names_every_class_of_the_tree() -> None:
    in_tree = {name for name, cls in CLASSES.items() if issubclass(cls, ProtoError)}
    assert in_tree - {"ProtoError"} == set(DRAWN)


def test_every_exception_of_the_package_is_in_the_tree() -> None:
    outside = {name for name, cls in CLASSES.items() if not issubclass(cls, ProtoError)}
    assert outside == OUTSIDE


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_each_class_sits_where_it_is_drawn(name: str) -> None:
    assert drawn_parent(CLASSES[name], set(DRAWN) | {"ProtoError"}) == DRAWN[name].parent


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_retryable_is_what_the_drawing_says(name: str) -> None:
    cls = CLASSES[name]
    assert issubclass(cls, ProtoError)
    assert cls.retryable is DRAWN[name].retryable


def test_the_root_is_permanent_and_a_class_line_can_say_otherwise() -> None:
    class Permanent(ProtoError):
        pass

    class Retryable(ProtoError, retryable=True):
        pass

    class Again(Retryable):
        pass

    class NotAgain(Retryable, retryable=False):
        pass

    assert not ProtoError.retryable and not Permanent().retryable
    assert Retryable().retryable and Again.retryable
    assert not NotAgain.retryable


def test_no_two_exception_classes_share_a_name() -> None:
    names = Counter(cls.__name__ for package in PACKAGES for cls in defined_exceptions(package))
    ours = {cls.__name__ for cls in CLASSES.values()}
    assert {name: n for name, n in names.items() if n > 1 and name in ours} == {}
