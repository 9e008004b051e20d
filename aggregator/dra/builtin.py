"""The DeviceClasses nicfleet ships (deploy/dra/deviceclasses.yaml), known without a file
so `nicfleetctl claim explain` needs `--class` only for other drivers' classes (NVIDIA's
`gpu.nvidia.com`). tests/unit/aggregator/dra/test_builtin.py keeps this equal to the
manifest. Pure data.
"""

from __future__ import annotations

from typing import Final

from aggregator.dra.objects import DeviceClass, Selector
from proto.dranames import DRIVER

_DRIVER: Final = f'device.driver == "{DRIVER}"'


def _link(layer: str) -> str:
    attr = f'device.attributes["{DRIVER}"].linkLayer'
    return f'{_DRIVER} && has({attr}) && {attr} == "{layer}"'


# Every class allocates only devices whose port is up, as the device plugin advertises only
# healthy devices: without it the scheduler would hand out a NIC whose port is DOWN (a
# stale node's devices read UNKNOWN and are passed over too).
ACTIVE: Final = (
    f'{_DRIVER} && has(device.attributes["{DRIVER}"].portState) '
    f'&& device.attributes["{DRIVER}"].portState == "ACTIVE"'
)


def _cls(name: str, expression: str) -> DeviceClass:
    return DeviceClass(
        name,
        (
            Selector(expression, f"class {name} selector #0"),
            Selector(ACTIVE, f"class {name} selector #1"),
        ),
    )


CLASSES: Final = (
    _cls(DRIVER, _DRIVER),
    _cls(f"ib.{DRIVER}", _link("InfiniBand")),
    _cls(f"roce.{DRIVER}", _link("Ethernet")),
)
