"""DRA's CEL variables and quantity helpers over the real CEL library."""

from __future__ import annotations

import pytest

from aggregator.dra import celenv
from aggregator.dra.objects import Device, Selector

DEVICE = Device(
    driver="gpu.nvidia.com",
    pool="n1",
    node="n1",
    name="gpu-0",
    attributes={"gpu.nvidia.com/type": "gpu", "resource.kubernetes.io/pcieRoot": "pci0000:3a"},
    capacity={"gpu.nvidia.com/memory": "80Gi"},
)


@pytest.mark.parametrize(
    ("text", "value"),
    [("80Gi", 80 * 2**30), ("1k", 1000), ("500m", 0.5), ("1.5", 1.5), ("2e3", 2000)],
)
def test_parse_quantity(text: str, value: float) -> None:
    assert celenv.parse_quantity(text) == value


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param('device.driver == "gpu.nvidia.com"', True, id="driver"),
        pytest.param(
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:3a"',
            True,
            id="standard",
        ),
        pytest.param(
            'device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("1Gi"))',
            True,
            id="quantity",
        ),
        pytest.param(
            'device.attributes["rdma.nicfleet.io"].size() == 0', True, id="unknown-domain-empty"
        ),
        pytest.param("device.allowMultipleAllocations", False, id="multi"),
    ],
)
def test_matches(expression: str, expected: bool) -> None:
    compiled = celenv.compile_selector(Selector(expression, "request r selector #0"))
    assert celenv.matches(compiled, DEVICE) is expected


def test_non_bool_result_is_a_runtime_error() -> None:
    compiled = celenv.compile_selector(Selector("1", "request r selector #0"))
    with pytest.raises(
        celenv.CelRuntimeError, match="request r selector #0: CEL '1' on gpu-0: returned int"
    ):
        celenv.matches(compiled, DEVICE)
