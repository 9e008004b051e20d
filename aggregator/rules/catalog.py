"""The rule catalogue: every rule's descriptor, in evaluation order — the families' explicit
tuples, concatenated — and the lookups derived from them (by id, the ids, severity order).

Pure data. A rule id is API (alert fingerprints, policy `alerts` keys, API filters) and is
never renamed; docs/rules.md documents every one (tests/unit/docs/test_rules_doc.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from aggregator.rules import (
    adapterloss,
    attachments,
    clockskew,
    counters,
    dataquality,
    dra,
    fleetpolicy,
    links,
    pluginconfig,
    topology,
    versions,
)
from aggregator.rules.descriptor import Rule

ALL_RULES: Final[tuple[Rule, ...]] = (
    *topology.RULES,
    *links.RULES,
    *counters.RULES,
    *versions.RULES,
    *fleetpolicy.RULES,
    *adapterloss.RULES,
    *pluginconfig.RULES,
    *attachments.RULES,
    *dra.RULES,
    *dataquality.RULES,
    *clockskew.RULES,
)
RULES: Final[Mapping[str, Rule]] = MappingProxyType({r.id: r for r in ALL_RULES})
RULE_IDS: Final[tuple[str, ...]] = tuple(r.id for r in ALL_RULES)
SEVERITY_ORDER: Final[Mapping[str, int]] = MappingProxyType(
    {"critical": 0, "warning": 1, "info": 2}
)
