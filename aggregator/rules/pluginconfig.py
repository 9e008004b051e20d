"""The `resource-config-invalid` rule: a device-plugin config entry the node's agent does not
serve because it is invalid (its other entries are served). The agent names the field at
fault in its DevicePluginStatus (`ResourceStatus.config_path`/`config_error`).

Pure: reads the stored status only. Such a resource is judged here, not by resource-zero.
"""

from __future__ import annotations

from typing import Final

from aggregator.rules.descriptor import Rule, RuleInput
from aggregator.rules.finding import Finding

RULE: Final = "resource-config-invalid"


def check_resource_config_invalid(given: RuleInput) -> list[Finding]:
    found: list[Finding] = []
    for node in sorted(given.fleet):
        status = given.fleet[node].device_plugin
        if status is None:
            continue
        for resource in status.resources:
            if resource.config_error is None:
                continue
            field = resource.config_path or "configList"
            found.append(
                Finding(
                    rule=RULE,
                    severity="critical",
                    node=node,
                    subject=resource.name,
                    message=f"{resource.name} is not served on {node}: its device-plugin "
                    f"config entry is invalid at {field} ({resource.config_error}); fix "
                    "that field — the node's other resources are served.",
                    evidence={
                        "field": field,
                        "reason": resource.config_error,
                        "config_generation": status.config_generation,
                    },
                )
            )
    return found


RULES: Final[tuple[Rule, ...]] = (
    Rule(id=RULE, family="fleet", severity="critical", check=check_resource_config_invalid,
         reads=frozenset({"device_plugin"})),
)  # fmt: skip
