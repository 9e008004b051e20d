"""The metric names a PromQL expression reads: a small tokenizer, not a parser.

String literals, durations, numbers, label matchers and `by (...)` / `without (...)` /
`on (...)` / `ignoring (...)` / `group_left (...)` lists are dropped; what remains of
the identifiers, minus functions, aggregations and keywords, are metric names.
"""

from __future__ import annotations

import re
from typing import Final

FUNCTIONS: Final = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_quantile",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "ln",
        "log10",
        "log2",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "predict_linear",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "sqrt",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "time",
        "timestamp",
        "vector",
        "year",
        "last_over_time",
        "present_over_time",
    ]
)
AGGREGATIONS: Final = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ]
)
KEYWORDS: Final = frozenset(
    [
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "inf",
        "nan",
    ]
)
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS: Final = re.compile(r"\{[^{}]*\}")
_RANGE: Final = re.compile(r"\[[^\]]*\]")
_GROUPING: Final = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT: Final = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER: Final = re.compile(r"\b\d[\w.]*")
# Grafana template variables and macros ($node, ${node}, $__rate_interval).
_VARIABLE: Final = re.compile(r"\$\{[^}]*\}|\$\w+")


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set(_IDENT.findall(text))
    return {n for n in names if n not in FUNCTIONS | AGGREGATIONS | KEYWORDS}
