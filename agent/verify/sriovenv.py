"""The SR-IOV network device plugin's env in the pod (k8snetworkplumbingwg/sriov-network-
device-plugin, pkg/resources/pool_stub.go GetEnvs): per allocated resource,
`PCIDEVICE_<PREFIX>_<NAME>` (the resource's prefix and name joined by `_`, dots made `_`,
upper-cased) holds the allocated device IDs joined by `,` — PCI functions, or auxiliary
device names for subfunctions — and `..._INFO` a JSON object of each ID's info providers
(`{"0000:3b:00.2": {"generic": {"deviceID": ...}, "rdma": {"rdma_dev": "mlx5_5", ...}}}`).

Pure: env in, evidence out; agent.verify.verdict judges it against the devices the pod sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Final

from proto.messages.validation import DeviceEvidence, SriovEnvEvidence

ENV_PREFIX: Final = "PCIDEVICE_"
INFO_SUFFIX: Final = "_INFO"
# A PCI function as sysfs and the plugin write it: domain:bus:device.function, lower hex.
_PCI: Final = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def env_name(resource: str) -> str:
    """The variable the plugin sets for `resource` ("nvidia.com/mlnx_sriov_rdma" ->
    "PCIDEVICE_NVIDIA_COM_MLNX_SRIOV_RDMA")."""
    prefix, _, name = resource.partition("/")
    return f"{ENV_PREFIX}{prefix}_{name}".replace(".", "_").upper()


def sriov_evidence(
    environ: Mapping[str, str], visible: Iterable[DeviceEvidence]
) -> tuple[SriovEnvEvidence, ...]:
    """One entry per `PCIDEVICE_*` allocation variable, by name, with the PCI functions no
    RDMA device the pod sees is (only for RDMA allocations: a netdevice-only pool's
    functions have no RDMA device by design)."""
    functions = {d.pci_address for d in visible if d.pci_address}
    found = []
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable.endswith(INFO_SUFFIX):
            continue
        ids = tuple(i.strip() for i in environ[variable].split(",") if i.strip())
        pci = tuple(i.lower() for i in ids if _PCI.fullmatch(i.lower()))
        rdma, rdma_devices, error = _info(environ.get(variable + INFO_SUFFIX), ids)
        missing = () if rdma is False else tuple(a for a in pci if a not in functions)
        found.append(
            SriovEnvEvidence(
                variable=variable,
                device_ids=ids,
                pci_addresses=pci,
                rdma=rdma,
                rdma_devices=rdma_devices,
                missing_pci_addresses=missing,
                info_error=error,
            )
        )
    return tuple(found)


def _info(raw: str | None, ids: tuple[str, ...]) -> tuple[bool | None, tuple[str, ...], str | None]:
    """(whether the allocation is RDMA, the rdma_dev of each ID, why _INFO is unreadable).
    None: no _INFO (plugins before v3.6 set none), so it cannot be told."""
    if raw is None:
        return None, (), None
    try:
        info = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, (), f"not JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(info, Mapping):
        return None, (), "not a JSON object"
    rdma: list[Mapping[str, object]] = []
    for device in ids:
        providers = info.get(device)
        entry = providers.get("rdma") if isinstance(providers, Mapping) else None
        if isinstance(entry, Mapping) and entry:
            rdma.append(entry)
    names = tuple(n for r in rdma if isinstance(n := r.get("rdma_dev"), str) and n)
    return bool(rdma), names, None
