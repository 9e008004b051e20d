"""Lab node specs, loading: YAML (a file or a built-in under specs/) decoded into the model
of nodespec.py, then checked by checks.py; every failure is a SpecError naming the file
and the field path. Pure apart from reading the spec file; it renders nothing (see
render.py).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import msgspec

from agent.errors import AgentError
from agent.lab.checks import problems
from agent.lab.nodespec import NodeSpec, bridge_of
from proto.subjects import InvalidNodeName, validate_node_name


class SpecError(AgentError, ValueError):
    """A spec that cannot be loaded: names the file and the field path ($.a[0].b)."""

    def __init__(self, file: str, path: str, message: str) -> None:
        super().__init__(f"{file}: {path}: {message}")
        self.file = file
        self.path = path
        self.message = message


def parse_spec(data: bytes | str, file: str = "<spec>") -> NodeSpec:
    """Decode and validate a YAML spec; every failure is a SpecError naming the field."""
    try:
        spec = msgspec.yaml.decode(data, type=NodeSpec)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).rpartition(" - at `")
        if not message:  # no location: the document itself has the wrong shape
            raise SpecError(file, "$", str(exc)) from exc
        if where.startswith("key` in `"):  # msgspec's form for a bad mapping key
            where, message = where.removeprefix("key` in `"), f"{message} (in a key)"
        raise SpecError(file, where.rstrip("`"), message) from exc
    except msgspec.DecodeError as exc:
        raise SpecError(file, "$", f"invalid YAML: {exc}") from exc
    check_spec(spec, file)
    return spec


def check_spec(spec: NodeSpec, file: str = "<spec>") -> None:
    """Raise a SpecError for the first semantic problem (see checks.py)."""
    for path, message in problems(spec):
        raise SpecError(file, path, message)
    for path, message in _kind_problems(spec):
        raise SpecError(file, path, message)


def _kind_problems(spec: NodeSpec) -> list[tuple[str, str]]:
    """Data Direct functions, bonds and sub-functions (agent/lab/rdmakinds.py) refer to
    the rest of the spec: parents that exist, members that are adapters, unique names."""
    found: list[tuple[str, str]] = []
    bridges = {hb.name for hb in spec.host_bridges}
    bridges |= {bridge_of(rp).address for hb in spec.host_bridges for rp in hb.root_ports}
    bridges |= {bridge_of(d).address for sw in spec.switches for d in sw.downstream}
    taken = {a.address for a in spec.adapters} | {g.address for g in spec.gpus} | bridges
    for i, dd in enumerate(spec.data_direct):
        if dd.parent not in bridges:
            found.append((f"$.data_direct[{i}].parent", f"no root or downstream port {dd.parent}"))
        if dd.address in taken:
            found.append((f"$.data_direct[{i}].address", f"duplicate PCI address {dd.address}"))
        taken.add(dd.address)
    adapters = {a.address: a for a in spec.adapters}
    in_bond: set[str] = set()
    for i, bond in enumerate(spec.bonds):
        for j, member in enumerate(bond.members):
            if member not in adapters:
                found.append((f"$.bonds[{i}].members[{j}]", f"no adapter at {member}"))
            elif adapters[member].ports[0].netdev is None:
                found.append((f"$.bonds[{i}].members[{j}]", "a bond member needs a netdev"))
            if member in in_bond:
                found.append((f"$.bonds[{i}].members[{j}]", f"{member} is in two bonds"))
            in_bond.add(member)
    names = [a.name for a in spec.adapters] + [b.name for b in spec.bonds]
    for a, adapter in enumerate(spec.adapters):
        for n, sf in enumerate(adapter.sub_functions):
            if sf.name in names:
                found.append((f"$.adapters[{a}].sub_functions[{n}].name", f"{sf.name} is taken"))
            names.append(sf.name)
    return found


def load_spec(path: Path) -> NodeSpec:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(str(path), "$", f"cannot read spec: {exc.strerror}") from exc
    return parse_spec(data, str(path))


def builtin_specs() -> list[str]:
    specs = importlib.resources.files("agent.lab").joinpath("specs")
    return sorted(p.name.removesuffix(".yaml") for p in specs.iterdir() if p.name.endswith(".yaml"))


def load_builtin(name: str) -> NodeSpec:
    if name not in builtin_specs():
        known = ", ".join(builtin_specs())
        raise SpecError(f"builtin:{name}", "$", f"no built-in spec {name!r} (known: {known})")
    resource = importlib.resources.files("agent.lab").joinpath("specs").joinpath(f"{name}.yaml")
    return parse_spec(resource.read_bytes(), f"builtin:{name}")


def with_node_name(spec: NodeSpec, node: str, file: str = "--node-name") -> NodeSpec:
    """The same hardware under another node name (GUIDs and MACs stay as they are)."""
    try:
        validate_node_name(node)
    except InvalidNodeName as exc:
        raise SpecError(file, "$.name", str(exc)) from exc
    return msgspec.structs.replace(spec, name=node)
