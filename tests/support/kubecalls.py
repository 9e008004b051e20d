"""The Kubernetes API calls aggregator/kube/client.py makes, read from its syntax tree: each
`self._<api>.<method>(...)` (or a list method handed to `self._watch`) becomes an
`Access` — group, resource, verb, namespace, object name — using the client's own
request path for that method and kube.py's constants and KubeSettings defaults for the
arguments. Nothing here is a hand-kept copy of the call list."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.aio import client as k8s

from aggregator.kube import client as kube
from aggregator.kube.client import KubeSettings

KUBE_PY = Path(kube.__file__)
_SUFFIXES = ("_without_preload_content", "_with_http_info")
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


@dataclass(frozen=True, order=True)
class Access:
    """One permission-shaped call; namespace "" = cluster-scoped or all namespaces,
    name "" = any object (not a constant in the code)."""

    group: str
    resource: str  # "pods", "nicfleetpolicies/status"
    verb: str
    namespace: str = ""
    name: str = ""


class Unresolved(Exception):
    """A call kube.py makes in a way this reader does not understand: extend it."""


def request_path(api: str, method: str) -> tuple[str, str]:
    """(HTTP method, path template) the client builds for `api.method`."""
    source = inspect.getsource(getattr(getattr(k8s, api), f"_{method}_serialize"))
    found = re.search(r"method='(\w+)',\s*resource_path='([^']+)'", source)
    if found is None:
        raise Unresolved(f"{api}.{method}: no request path in the client")
    return found[1], found[2]


def access(verb_http: str, path: str, watch: bool) -> Access:
    """An Access from a filled request path: /api/v1/... or /apis/GROUP/VERSION/..."""
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], (rest[1:2] or [""])[0], rest[2:]
    if "{" in namespace:
        raise Unresolved(f"{path}: namespace not a constant")
    if verb_http == "GET":
        verb = "watch" if watch else ("get" if name else "list")
    else:
        verb = _VERBS[verb_http]
    return Access(
        group,
        resource + "".join(f"/{s}" for s in sub),
        verb,
        namespace,
        "" if "{" in name else name,
    )


class _Values:
    """Values of argument expressions inside one KubeClient method."""

    def __init__(self, function: ast.AST) -> None:
        self.local: dict[str, Any] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                try:
                    value = self.value(node.value)
                except Unresolved:
                    continue
                if isinstance(target, ast.Name):
                    self.local[target.id] = value
                elif isinstance(target, ast.Tuple) and isinstance(value, tuple):
                    for element, item in zip(target.elts, value, strict=True):
                        if isinstance(element, ast.Name):
                            self.local[element.id] = item

    def value(self, expr: ast.expr) -> Any:
        if isinstance(expr, ast.Constant):
            return expr.value
        if isinstance(expr, ast.Name):
            if expr.id in self.local:
                return self.local[expr.id]
            if expr.id.isupper() and hasattr(kube, expr.id):
                return getattr(kube, expr.id)
            raise Unresolved(expr.id)
        if (
            isinstance(expr, ast.Attribute)
            and ast.unparse(expr.value) == "self._settings"
            and hasattr(KubeSettings, expr.attr)
        ):
            return getattr(KubeSettings(), expr.attr)
        raise Unresolved(ast.unparse(expr))

    def positional(self, args: list[ast.expr]) -> list[Any]:
        out: list[Any] = []
        for arg in args:
            if isinstance(arg, ast.Starred):
                out.extend(self.value(arg.value))
                continue
            try:
                out.append(self.value(arg))
            except Unresolved:
                out.append(None)  # a runtime value (an object name, a body)
        return out


def _call(api: str, method: str, args: list[Any], watch: bool) -> Access:
    method = next((method.removesuffix(s) for s in _SUFFIXES if method.endswith(s)), method)
    http, template = request_path(api, method)
    params = list(inspect.signature(getattr(getattr(k8s, api), method)).parameters)[1:]
    values = dict(zip(params, args, strict=False))

    def fill(match: re.Match[str]) -> str:
        value = values.get(match[1])
        return str(value) if value is not None else match[0]

    return access(http, re.sub(r"\{(\w+)\}", fill, template), watch)


def kube_calls(path: Path = KUBE_PY) -> set[Access]:
    """Every API access `KubeClient` in `path` can make."""
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeClient"]
    apis: dict[str, str] = {}  # self._core -> CoreV1Api
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).startswith("k8s.")
            and ast.unparse(node.value.func).endswith("Api")
        ):
            (target,) = node.targets
            apis[ast.unparse(target)] = ast.unparse(node.value.func).removeprefix("k8s.")
    found: set[Access] = set()
    seen: set[int] = set()
    for function in cls.body:
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        values = _Values(function)
        for node in ast.walk(function):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if ast.unparse(func) == "self._watch":
                ref = node.args[1]
                assert isinstance(ref, ast.Attribute)
                api = apis[ast.unparse(ref.value)]
                found.add(_call(api, ref.attr, values.positional(node.args[2:]), True))
                seen.add(id(ref))
            elif isinstance(func, ast.Attribute) and ast.unparse(func.value) in apis:
                api = apis[ast.unparse(func.value)]
                found.add(_call(api, func.attr, values.positional(node.args), False))
                seen.add(id(func))
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Attribute)
                and ast.unparse(node.value) in apis
                and id(node) not in seen
            ):
                raise Unresolved(f"line {node.lineno}: {ast.unparse(node)} used another way")
    return found
