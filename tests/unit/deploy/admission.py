"""What the API server does with a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1)
and a CRD's `x-kubernetes-validations`, evaluated offline with a real CEL implementation
(PyPI common-expression-language, the Rust `cel` crate). The expressions are always the
ones in the rendered manifests; this module only supplies the variables Kubernetes binds
(`object`, `oldObject`, `request`, `params`, `variables`, `self`) and the policy's order:
match constraints, match conditions, variables, validations. An expression that fails to
evaluate counts as a refusal, as with `failurePolicy: Fail`.

Only functions that standard CEL and Kubernetes' CEL both have may appear (STANDARD); the
Kubernetes extensions (optional `.?`, `split`, `lowerAscii`, quantities, ...) are not in
this implementation, so a policy using one fails here first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import cel

# Functions both standard CEL and Kubernetes provide (macros compile to the operators).
STANDARD: Final = frozenset({
    "@in", "@not_strictly_false", "!_", "-_", "_&&_", "_||_", "_?_:_", "_+_", "_-_", "_*_",
    "_/_", "_%_", "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "_[_]", "size", "startsWith",
    "endsWith", "contains", "matches", "string", "int",
})  # fmt: skip
ROOTS: Final = frozenset({"object", "oldObject", "request", "params", "variables", "self"})
_EVAL_ERRORS = (KeyError, TypeError, RuntimeError, ValueError)


class NotStandard(Exception):
    """An expression uses a function outside STANDARD."""


def check_standard(expression: str) -> None:
    """Compiles `expression` (ValueError on a syntax error) and refuses functions outside
    STANDARD: what passes here means the same in Kubernetes."""
    extra = set(cel.compile(expression).functions()) - STANDARD
    if extra:
        raise NotStandard(f"{sorted(extra)} in {expression!r}")


def evaluate(expression: str, bindings: Mapping[str, Any]) -> Any:
    return cel.evaluate(expression, dict(bindings))


def outcome(expression: str, bindings: Mapping[str, Any]) -> bool | str:
    """True/False, or the evaluation error as text (a refusal under failurePolicy Fail)."""
    try:
        value = evaluate(expression, bindings)
    except _EVAL_ERRORS as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return value if isinstance(value, bool) else f"error: not a bool: {value!r}"


@dataclass(frozen=True)
class Decision:
    applies: bool  # matched by the constraints and every match condition
    refused: tuple[str, ...]  # the messages of the validations that did not answer true

    @property
    def allowed(self) -> bool:
        return not self.refused


def request(
    operation: str, username: str, extra: Mapping[str, list[str]] | None = None
) -> dict[str, Any]:
    user: dict[str, Any] = {"username": username}
    if extra is not None:  # as in Kubernetes: absent unless the authenticator set some
        user["extra"] = dict(extra)
    return {"operation": operation, "userInfo": user}


def _matches(policy: Mapping[str, Any], resource: str, operation: str) -> bool:
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    return any(
        resource in r["resources"] and (operation in r["operations"] or "*" in r["operations"])
        for r in rules
    )


def admit(
    policy: Mapping[str, Any],
    *,
    resource: str,
    operation: str,
    username: str,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    extra: Mapping[str, list[str]] | None = None,
) -> Decision:
    """The decision of `policy` (a rendered ValidatingAdmissionPolicy) on one request."""
    spec = policy["spec"]
    if not _matches(policy, resource, operation):
        return Decision(applies=False, refused=())
    bindings: dict[str, Any] = {
        "object": obj,
        "oldObject": old,
        "request": request(operation, username, extra),
        "params": params,
    }
    for condition in spec.get("matchConditions", []):
        found = outcome(condition["expression"], bindings)
        if found is False:
            return Decision(applies=False, refused=())
        if found is not True:
            return Decision(applies=True, refused=(f"{condition['name']}: {found}",))
    variables: dict[str, Any] = {}
    failed: list[str] = []
    for variable in spec.get("variables", []):
        try:
            variables[variable["name"]] = evaluate(variable["expression"], {
                **bindings, "variables": variables,
            })  # fmt: skip
        except _EVAL_ERRORS as exc:
            failed.append(f"variable {variable['name']}: {type(exc).__name__}")
    bindings["variables"] = variables
    refused: list[str] = []
    for validation in spec["validations"]:
        found = outcome(validation["expression"], bindings)
        if found is True:
            continue
        message = validation.get("message", "")
        if "messageExpression" in validation:
            # As in Kubernetes: a failing messageExpression falls back to `message`.
            with contextlib.suppress(*_EVAL_ERRORS):
                message = str(evaluate(validation["messageExpression"], bindings))
        refused.append(message if found is False else f"{message} ({found}; {failed})")
    return Decision(applies=True, refused=tuple(refused))


def crd_rules(schema: Mapping[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every `x-kubernetes-validations` rule of an OpenAPI schema with its path:
    `.spec.rdmaSharedDevicePlugin.configList[]` ("[]": each item, "{}": each value)."""
    found = [(path, rule) for rule in schema.get("x-kubernetes-validations", [])]
    for name, child in schema.get("properties", {}).items():
        found += crd_rules(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += crd_rules(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += crd_rules(schema["additionalProperties"], f"{path}{{}}")
    return found


def values_at(document: Any, path: str) -> list[Any]:
    """The values `path` (as crd_rules writes it) selects in `document`; absent: none."""
    values = [document]
    for step in path.replace("[]", ".[]").replace("{}", ".{}").split(".")[1:]:
        selected: list[Any] = []
        for value in values:
            if step == "[]" and isinstance(value, list):
                selected += value
            elif step == "{}" and isinstance(value, dict):
                selected += value.values()
            elif isinstance(value, dict) and step in value:
                selected.append(value[step])
        values = selected
    return values


def crd_refusals(schema: Mapping[str, Any], document: Mapping[str, Any]) -> list[str]:
    """The messages of every CRD rule that is not true for some value it applies to,
    with `self` bound to that value (no oldSelf: these rules are not transition rules)."""
    refused: list[str] = []
    for path, rule in crd_rules(schema):
        for value in values_at(document, path):
            if outcome(rule["rule"], {"self": value}) is not True:
                refused.append(f"{path}: {rule['message']}")
    return refused
