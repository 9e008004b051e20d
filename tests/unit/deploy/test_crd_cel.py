"""The NicFleetPolicy CRD's own CEL rules (`x-kubernetes-validations`), evaluated offline
with the same CEL implementation as the admission policies (tests/unit/deploy/admission.py),
`self` bound to each value a rule sits on: the shipped example passes, and each invalid
example is refused by exactly the rule that names its mistake."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.unit.deploy import admission
from tests.unit.deploy.rendered import find, render

CONFIG_LIST = ".spec.rdmaSharedDevicePlugin.configList"
UNIQUE = f"{CONFIG_LIST}: resourcePrefix/resourceName must be unique"
COMBINED = (
    f"{CONFIG_LIST}[]: selectors and devices cannot be combined; put the names in selectors.ifNames"
)
NOTHING = (
    f"{CONFIG_LIST}[]: give selectors (or a devices list): otherwise the resource selects nothing"
)
HCA_MAX = (
    f"{CONFIG_LIST}[]: rdmaHcaMax is required unless exclusive"
    " (upstream silently advertises 0 without it)"
)
OPERATOR = (
    ".spec.nodeSelector.matchExpressions[]: In and NotIn need values;"
    " Exists and DoesNotExist take none"
)


def schema() -> dict[str, Any]:
    crd = find(render(""), "CustomResourceDefinition", "nicfleetpolicies.nicfleet.io")
    (version,) = crd["spec"]["versions"]
    result: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return result


def example() -> dict[str, Any]:
    (policy,) = render("examples")
    return copy.deepcopy(policy)


def test_every_rule_is_found_and_standard_cel() -> None:
    rules = admission.crd_rules(schema())
    assert {path for path, _ in rules} == {
        CONFIG_LIST,
        f"{CONFIG_LIST}[]",
        ".spec.nodeSelector.matchExpressions[]",
    }
    assert len(rules) == 5
    for _, rule in rules:
        admission.check_standard(rule["rule"])


def test_the_example_policy_passes_every_rule() -> None:
    policy = example()
    assert admission.values_at(policy, f"{CONFIG_LIST}[]"), "the example has a configList"
    assert admission.crd_refusals(schema(), policy) == []


def _configs(policy: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = policy["spec"]["rdmaSharedDevicePlugin"]["configList"]
    return found


def _first(policy: dict[str, Any]) -> dict[str, Any]:
    return _configs(policy)[0]


def _config(*drop: str, **values: Any) -> Any:
    """Drop keys from, then set values in, the first configList entry."""

    def change(policy: dict[str, Any]) -> None:
        for key in drop:
            del _first(policy)[key]
        _first(policy).update(values)

    return change


def _duplicate(policy: dict[str, Any]) -> None:
    _configs(policy).append(copy.deepcopy(_first(policy)))


def _duplicate_with_explicit_default_prefix(policy: dict[str, Any]) -> None:
    _configs(policy).append({**copy.deepcopy(_first(policy)), "resourcePrefix": "rdma"})


def _expressions(*items: dict[str, Any]) -> Any:
    return lambda p: p["spec"]["nodeSelector"].update(matchExpressions=list(items))


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        pytest.param(_duplicate, [UNIQUE], id="duplicate-name"),
        pytest.param(_duplicate_with_explicit_default_prefix, [UNIQUE], id="default-prefix"),
        pytest.param(_config(devices=["ib0"]), [COMBINED], id="both"),
        pytest.param(_config("selectors"), [NOTHING], id="neither"),
        pytest.param(_config("selectors", devices=[]), [NOTHING], id="empty-devices"),
        pytest.param(_config("rdmaHcaMax"), [HCA_MAX], id="no-hca-max"),
        pytest.param(_config("rdmaHcaMax", exclusive=False), [HCA_MAX], id="not-exclusive"),
        pytest.param(_expressions({"key": "a", "operator": "In"}), [OPERATOR], id="in-no-values"),
        pytest.param(_expressions({"key": "a", "operator": "NotIn", "values": []}), [OPERATOR],
                     id="notin-empty"),
        pytest.param(_expressions({"key": "a", "operator": "Exists", "values": ["x"]}),
                     [OPERATOR], id="exists-values"),
    ],
)  # fmt: skip
def test_an_invalid_policy_is_refused_by_its_rule(change: Any, refused: list[str]) -> None:
    policy = example()
    change(policy)
    assert admission.crd_refusals(schema(), policy) == refused


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: _configs(p).append({**copy.deepcopy(_first(p)),
                                                   "resourcePrefix": "nvidia.com"}),
                     id="same-name-other-prefix"),
        pytest.param(_config("rdmaHcaMax", exclusive=True), id="exclusive-without-hca-max"),
        pytest.param(_config("selectors", devices=["ib0"]), id="devices-instead-of-selectors"),
        pytest.param(_expressions({"key": "a", "operator": "In", "values": ["x"]},
                                  {"key": "b", "operator": "DoesNotExist"}), id="expressions"),
    ],
)  # fmt: skip
def test_a_valid_variation_passes(change: Any) -> None:
    policy = example()
    change(policy)
    assert admission.crd_refusals(schema(), policy) == []
