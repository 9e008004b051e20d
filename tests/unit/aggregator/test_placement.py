"""DaemonSet placement (pure): toleration semantics (core/v1 Toleration.ToleratesTaint),
node-affinity terms (component-helpers nodeaffinity, apimachinery label requirements), the
DaemonSet controller's added tolerations and its verdict; table tests with the upstream
cases, property tests with hypothesis, and parsing of API-shaped JSON."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.kube.objects import daemonset_from_object, node_from_object
from aggregator.placement import (
    DAEMON_TOLERATIONS,
    Requirement,
    SelectorTerm,
    Taint,
    Toleration,
    affinity_matches,
    daemon_fit,
    daemon_tolerations,
    field_matches,
    required_affinity_from,
    requirement_matches,
    taints_from,
    term_matches,
    tolerates,
    tolerations_from,
    untolerated,
)

NODE = "gpu-001"
NO_SCHEDULE = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param(Toleration(key="foo", operator="Equal", value="bar", effect="NoSchedule"),
                     Taint(key="foo", value="bar", effect="NoSchedule"), True, id="equal"),
        pytest.param(Toleration(key="foo", value="bar", effect="NoSchedule"),
                     Taint(key="foo", value="bar", effect="NoSchedule"), True,
                     id="no-operator-is-equal"),
        pytest.param(Toleration(key="foo", operator="Equal", value="baz", effect="NoSchedule"),
                     Taint(key="foo", value="bar", effect="NoSchedule"), False,
                     id="other-value"),
        pytest.param(Toleration(key="foo", operator="Exists", effect="NoSchedule"),
                     Taint(key="foo", value="bar", effect="NoSchedule"), True,
                     id="exists-ignores-value"),
        pytest.param(Toleration(key="foo", operator="Exists", effect="NoExecute"),
                     Taint(key="foo", value="bar", effect="NoSchedule"), False,
                     id="other-effect"),
        pytest.param(Toleration(key="foo", operator="Exists"),
                     Taint(key="foo", effect="NoExecute"), True, id="empty-effect-any"),
        pytest.param(Toleration(operator="Exists"),
                     Taint(key="anything", value="x", effect="NoExecute"), True,
                     id="empty-key-exists-all"),
        pytest.param(Toleration(operator="Equal", value="x"),
                     Taint(key="anything", value="x", effect="NoSchedule"), True,
                     id="empty-key-equal-value"),
        pytest.param(Toleration(key="foo", operator="Exists", effect="NoSchedule"),
                     Taint(key="bar", effect="NoSchedule"), False, id="other-key"),
        pytest.param(Toleration(key="foo", operator="Gt", value="1"),
                     Taint(key="foo", value="2", effect="NoSchedule"), False,
                     id="unknown-operator-tolerates-nothing"),
    ],
)  # fmt: skip
def test_tolerates(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


LABELS = {"kubernetes.io/os": "linux", "nvidia.com/rail": "3", "gpu": "true"}


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        pytest.param(Requirement(key="kubernetes.io/os", operator="In", values=("linux",)),
                     True, id="in"),
        pytest.param(Requirement(key="kubernetes.io/os", operator="In", values=("windows",)),
                     False, id="in-other"),
        pytest.param(Requirement(key="zone", operator="In", values=("a",)), False,
                     id="in-missing-key"),
        pytest.param(Requirement(key="zone", operator="NotIn", values=("a",)), True,
                     id="notin-missing-key"),
        pytest.param(Requirement(key="kubernetes.io/os", operator="NotIn", values=("linux",)),
                     False, id="notin"),
        pytest.param(Requirement(key="gpu", operator="Exists"), True, id="exists"),
        pytest.param(Requirement(key="gpu", operator="DoesNotExist"), False, id="doesnotexist"),
        pytest.param(Requirement(key="nvidia.com/rail", operator="Gt", values=("2",)), True,
                     id="gt"),
        pytest.param(Requirement(key="nvidia.com/rail", operator="Lt", values=("3",)), False,
                     id="lt-equal"),
        pytest.param(Requirement(key="gpu", operator="Gt", values=("0",)), False,
                     id="gt-label-not-a-number"),
        pytest.param(Requirement(key="zone", operator="Lt", values=("9",)), False,
                     id="lt-missing-key"),
        pytest.param(Requirement(key="gpu", operator="In"), None, id="in-without-values"),
        pytest.param(Requirement(key="gpu", operator="Exists", values=("true",)), None,
                     id="exists-with-values"),
        pytest.param(Requirement(key="nvidia.com/rail", operator="Gt", values=("1", "2")),
                     None, id="gt-two-values"),
        pytest.param(Requirement(key="nvidia.com/rail", operator="Gt", values=("1.5",)), None,
                     id="gt-not-an-integer"),
        pytest.param(Requirement(key="gpu", operator="Equals", values=("true",)), None,
                     id="not-a-node-selector-operator"),
    ],
)  # fmt: skip
def test_requirement_matches(requirement: Requirement, expected: bool | None) -> None:
    assert requirement_matches(requirement, LABELS) is expected


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        pytest.param(Requirement(key="metadata.name", operator="In", values=(NODE,)), True,
                     id="in"),
        pytest.param(Requirement(key="metadata.name", operator="NotIn", values=(NODE,)), False,
                     id="notin"),
        pytest.param(Requirement(key="metadata.name", operator="In", values=("gpu-002",)),
                     False, id="other-node"),
        pytest.param(Requirement(key="metadata.name", operator="In", values=(NODE, "x")), None,
                     id="two-values"),
        pytest.param(Requirement(key="metadata.uid", operator="In", values=(NODE,)), None,
                     id="other-field"),
        pytest.param(Requirement(key="metadata.name", operator="Exists"), None,
                     id="exists-on-a-field"),
    ],
)  # fmt: skip
def test_field_matches(requirement: Requirement, expected: bool | None) -> None:
    assert field_matches(requirement, NODE) is expected


LINUX = Requirement(key="kubernetes.io/os", operator="In", values=("linux",))
WINDOWS = Requirement(key="kubernetes.io/os", operator="In", values=("windows",))
BAD = Requirement(key="gpu", operator="In")
THIS_NODE = Requirement(key="metadata.name", operator="In", values=(NODE,))


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        pytest.param(None, True, id="unset"),
        pytest.param((), False, id="no-terms"),
        pytest.param((SelectorTerm(),), False, id="empty-term"),
        pytest.param((SelectorTerm(match_expressions=(LINUX,)),), True, id="one"),
        pytest.param((SelectorTerm(match_expressions=(LINUX, WINDOWS)),), False, id="and"),
        pytest.param((SelectorTerm(match_expressions=(WINDOWS,)),
                      SelectorTerm(match_expressions=(LINUX,))), True, id="or"),
        pytest.param((SelectorTerm(match_expressions=(LINUX, BAD)),), False,
                     id="invalid-term-skipped"),
        pytest.param((SelectorTerm(match_expressions=(BAD,)),
                      SelectorTerm(match_fields=(THIS_NODE,))), True,
                     id="invalid-term-beside-a-match"),
        pytest.param((SelectorTerm(match_expressions=(LINUX,), match_fields=(THIS_NODE,)),),
                     True, id="labels-and-fields"),
    ],
)  # fmt: skip
def test_affinity_matches(terms: tuple[SelectorTerm, ...] | None, expected: bool) -> None:
    assert affinity_matches(terms, NODE, LABELS) is expected


def fit(**kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "node_name": NODE, "labels": LABELS, "taints": (), "template_node": None,
        "node_selector": {}, "affinity": None, "tolerations": (), "host_network": False,
    }  # fmt: skip
    return daemon_fit(**(args | kwargs))


def test_daemon_fit_verdicts() -> None:
    assert fit().runs
    assert not fit(template_node="gpu-002").selected
    off = fit(node_selector={"kubernetes.io/os": "windows"})
    assert (off.runs, off.selected) == (False, False)
    assert off.why == "its nodeSelector (kubernetes.io/os=windows) does not match the node's labels"
    away = fit(affinity=(SelectorTerm(match_expressions=(WINDOWS,)),))
    assert (away.selected, away.why) == (
        False,
        "its required node affinity does not match the node",
    )
    # nodeSelector AND affinity: both must hold.
    assert not fit(node_selector={"gpu": "true"}, affinity=(SelectorTerm(),)).selected
    tainted = fit(taints=(NO_SCHEDULE,))
    assert (tainted.runs, tainted.selected) == (False, True)
    assert tainted.taints == ("nvidia.com/gpu=present:NoSchedule",)
    assert tainted.why == "it does not tolerate the node's taint nvidia.com/gpu=present:NoSchedule"
    gpu = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    assert fit(taints=(NO_SCHEDULE,), tolerations=(gpu,)).runs
    assert fit(taints=(Taint(key="x", effect="PreferNoSchedule"),)).runs


@pytest.mark.parametrize(
    ("taint", "host_network", "runs"),
    [
        pytest.param(Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"), False,
                     True, id="cordoned"),
        pytest.param(Taint(key="node.kubernetes.io/not-ready", effect="NoExecute"), False, True,
                     id="not-ready"),
        pytest.param(Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"), False,
                     True, id="unreachable"),
        pytest.param(Taint(key="node.kubernetes.io/disk-pressure", effect="NoSchedule"), False,
                     True, id="disk-pressure"),
        pytest.param(Taint(key="node.kubernetes.io/not-ready", effect="NoSchedule"), False,
                     False, id="not-ready-noschedule-not-added"),
        pytest.param(Taint(key="node.kubernetes.io/network-unavailable", effect="NoSchedule"),
                     False, False, id="network-unavailable-pod-network"),
        pytest.param(Taint(key="node.kubernetes.io/network-unavailable", effect="NoSchedule"),
                     True, True, id="network-unavailable-host-network"),
    ],
)  # fmt: skip
def test_the_controllers_own_tolerations(taint: Taint, host_network: bool, runs: bool) -> None:
    assert fit(taints=(taint,), host_network=host_network).runs is runs


# --- properties -----------------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "nvidia.com/gpu", "node.kubernetes.io/unschedulable"])
VALUES = st.sampled_from(["", "x", "y", "1", "-3", "42"])
EFFECTS = st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])
taints = st.builds(Taint, key=KEYS, value=VALUES, effect=EFFECTS)
tolerations = st.builds(
    Toleration, key=st.one_of(st.just(""), KEYS), operator=st.sampled_from(["", "Equal", "Exists"]),
    value=VALUES, effect=st.one_of(st.just(""), EFFECTS),
)  # fmt: skip
labels = st.dictionaries(KEYS, VALUES, max_size=4)


@given(taint=taints)
def test_exists_without_key_tolerates_every_taint(taint: Taint) -> None:
    assert tolerates(Toleration(operator="Exists"), taint)


@given(st.lists(taints, max_size=5), st.lists(tolerations, max_size=4), tolerations)
def test_another_toleration_never_leaves_more_taints(
    node_taints: list[Taint], own: list[Toleration], extra: Toleration
) -> None:
    before = untolerated(node_taints, tuple(own))
    after = untolerated(node_taints, (*own, extra))
    assert set(after) <= set(before)
    assert all(t.effect != "PreferNoSchedule" for t in before)


@given(st.lists(tolerations, max_size=4), st.booleans())
def test_the_controller_only_adds(own: list[Toleration], host_network: bool) -> None:
    merged = daemon_tolerations(own, host_network=host_network)
    assert merged[: len(own)] == tuple(own) and set(DAEMON_TOLERATIONS) <= set(merged)


@given(labels, KEYS, st.lists(VALUES, min_size=1, max_size=3))
def test_in_and_notin_are_complements(have: dict[str, str], key: str, values: list[str]) -> None:
    yes = requirement_matches(Requirement(key=key, operator="In", values=tuple(values)), have)
    no = requirement_matches(Requirement(key=key, operator="NotIn", values=tuple(values)), have)
    assert yes is not None and no is not None and yes != no
    exists = requirement_matches(Requirement(key=key, operator="Exists"), have)
    assert exists is (key in have)
    assert requirement_matches(Requirement(key=key, operator="DoesNotExist"), have) is not exists


@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_gt_and_lt_compare_integers(have: int, bound: int) -> None:
    node = {"n": str(have)}
    gt = requirement_matches(Requirement(key="n", operator="Gt", values=(str(bound),)), node)
    lt = requirement_matches(Requirement(key="n", operator="Lt", values=(str(bound),)), node)
    assert (gt, lt) == (have > bound, have < bound)


requirements = st.builds(
    Requirement, key=KEYS,
    operator=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
    values=st.lists(VALUES, max_size=2).map(tuple),
)  # fmt: skip
terms = st.builds(SelectorTerm, match_expressions=st.lists(requirements, max_size=3).map(tuple))


@given(st.lists(terms, max_size=3), terms, labels)
def test_another_term_never_unselects(
    some: list[SelectorTerm], extra: SelectorTerm, have: dict[str, str]
) -> None:
    if affinity_matches(tuple(some), NODE, have):
        assert affinity_matches((*some, extra), NODE, have)
    assert affinity_matches((extra,), NODE, have) == (term_matches(extra, NODE, have) is True)


# --- from the API's JSON ----------------------------------------------------------------------


def test_a_nodes_taints_and_a_daemonsets_placement_from_api_json() -> None:
    node = node_from_object({
        "metadata": {"name": NODE, "labels": LABELS},
        "spec": {"unschedulable": True, "taints": [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
             "timeAdded": "2027-01-15T08:00:00Z"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"effect": "NoSchedule"},  # no key: not a taint the API server accepts
        ]},
    })  # fmt: skip
    assert node is not None
    assert node.taints == (
        Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule"), NO_SCHEDULE,
    )  # fmt: skip
    template = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "hostNetwork": True,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule",
                         "tolerationSeconds": 30}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/rail", "operator": "Gt",
                                       "values": ["2"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": ["gpu-009"]}]},
            ]}}},
    }  # fmt: skip
    ds = daemonset_from_object(
        {"metadata": {"name": "kube-multus-ds", "namespace": "nvidia-network-operator"},
         "spec": {"template": {"spec": template}}, "status": {}},
        (),
    )  # fmt: skip
    assert ds is not None
    assert ds.tolerations == (
        Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    )
    assert ds.host_network and ds.template_node is None
    assert ds.affinity == required_affinity_from(template["affinity"])
    assert ds.affinity is not None and len(ds.affinity) == 2
    result = daemon_fit(
        node_name=node.name, labels=node.labels, taints=node.taints,
        template_node=ds.template_node, node_selector=ds.node_selector, affinity=ds.affinity,
        tolerations=ds.tolerations, host_network=ds.host_network,
    )  # fmt: skip
    assert result.runs  # rail 3 > 2; the cordon and the gpu taint are tolerated


@pytest.mark.parametrize(
    "raw", [None, "x", [1, None, "y"], {"key": "a"}], ids=["none", "text", "junk-items", "dict"]
)
def test_malformed_fields_read_as_absent(raw: object) -> None:
    assert taints_from(raw) == ()
    assert tolerations_from(raw) == ()
    assert required_affinity_from({"nodeAffinity": raw}) is None
