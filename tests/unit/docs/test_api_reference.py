"""docs/api-reference.md is what docs/gen_api_reference.py renders now from the served OpenAPI
document, and that document covers every route the aggregator service registers."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from aggregator.api.openapiops import OPERATIONS, POST_OPERATIONS, VALIDATION_OPERATIONS
from tests.support.paths import REPO

ROOT = REPO
OUTPUT = ROOT / "docs" / "api-reference.md"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_api_reference", ROOT / "docs" / "gen_api_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_generated_from_the_served_document() -> None:
    rendered = generator().render()
    assert OUTPUT.read_text(encoding="utf-8") == rendered, (
        "docs/api-reference.md is stale: run `make docs-api` "
        "(or `.venv/bin/python docs/gen_api_reference.py`) and commit it"
    )


def test_the_route_table_is_the_services_whole_api() -> None:
    routes = generator().routes()
    documented = {*(("GET", p) for p in OPERATIONS), *(("GET", p) for p in VALIDATION_OPERATIONS)}
    documented |= {("POST", p) for p in POST_OPERATIONS}
    api = {(m, p) for m, p in routes if m != "HEAD" and not (p.startswith("/ui") or p == "/")}
    assert api == documented
    assert any(p.startswith("/ui") for _, p in routes)  # the status page is registered too


def test_every_operation_has_a_section_with_auth_and_responses() -> None:
    gen = generator()
    doc = gen.document()
    text = gen.render(doc)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            section = text.split(f"\n### {method.upper()} {path}\n", 1)[1].split("\n### ", 1)[0]
            assert "Auth: " in section, (method, path)
            for status in op["responses"]:
                assert f"\n| {status} | " in section, (method, path, status)
    assert "| [`GET /healthz`](#get-healthz) | open |" in text
    assert "| [`POST /api/v1/validations`](#post-apiv1validations) | bearer (admin) |" in text


def test_schema_summaries() -> None:
    type_ = generator()._type
    assert type_({"$ref": "#/components/schemas/NodeDetail"}) == "[NodeDetail](#nodedetail)"
    assert type_({"type": "array", "items": {"type": "integer", "minimum": 0}}) == (
        "array of integer (≥ 0)"
    )
    assert type_({"anyOf": [{"type": "number"}, {"type": "null"}]}) == "number or null"
    assert type_({"enum": ["a", "b"]}) == 'one of `"a"`, `"b"`'
    assert type_({"type": "object", "additionalProperties": {"type": "string"}}) == (
        "object of string"
    )
