"""NKey seed files for nicfleet's NATS identities, and `nicfleet-aggregator nats-auth`.

Generates one user seed per agent node, per alert observer and for the aggregator (mode
0600, kept on re-runs unless rotated) and writes the server config that
`aggregator.bus.permissions` renders from their public keys. Seeds stay in their files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import click
import nkeys

from aggregator.bus.permissions import Identity, Role, ServerTls, render_server_config
from proto import subjects
from proto.runtime.cliopts import output_option
from proto.runtime.natsconnect import NatsSecurityError, read_user_seed

SERVER_CONFIG = "server-auth.conf"
AGGREGATOR_SEED = "aggregator.nk"
# The validation pods' one identity: publish a ValidationResult, nothing else (docs/validation.md).
VALIDATION_SEED = "validation.nk"
# The auth callout (agents join with a ServiceAccount token, docs/security.md): the user
# the responder connects as, and the account key that signs its answers.
CALLOUT_SEED = "callout.nk"
CALLOUT_ISSUER_SEED = "callout-issuer.nk"
AGENTS_DIR = "agents"
OBSERVERS_DIR = "observers"


@dataclass(frozen=True, kw_only=True)
class Provisioned:
    config: Path
    aggregator_seed: Path
    validation_seed: Path
    agent_seeds: dict[str, Path]  # node -> seed file
    observer_seeds: dict[str, Path]  # name -> seed file (alert readers)
    created: tuple[str, ...]  # identities whose seed was written this run
    kept: tuple[str, ...]
    callout_seed: Path | None = None
    callout_issuer_seed: Path | None = None

    def summary(self) -> dict[str, object]:
        callout = {
            "callout_seed": str(self.callout_seed),
            "callout_issuer_seed": str(self.callout_issuer_seed),
        }
        return {
            **(callout if self.callout_seed is not None else {}),
            "config": str(self.config),
            "aggregator_seed": str(self.aggregator_seed),
            "validation_seed": str(self.validation_seed),
            "agent_seeds": {node: str(path) for node, path in sorted(self.agent_seeds.items())},
            "observer_seeds": {n: str(path) for n, path in sorted(self.observer_seeds.items())},
            "created": list(self.created),
            "kept": list(self.kept),
        }


def new_user_seed() -> bytes:
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key(seed: str | bytes) -> str:
    raw = seed.encode() if isinstance(seed, str) else seed
    return str(nkeys.from_seed(bytearray(raw)).public_key.decode())


def _write_secret(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data + b"\n")
    tmp.replace(path)


def _ensure_seed(path: Path, *, rotate: bool) -> tuple[str, bool]:
    """(public key, created) for the seed at `path`, generating it when missing."""
    if path.exists() and not rotate:
        return public_key(read_user_seed(path, flag=f"seed file {path.name}")), False
    seed = new_user_seed()
    _write_secret(path, seed)
    return public_key(seed), True


def _ensure_account_seed(path: Path, *, rotate: bool) -> tuple[str, bool]:
    """(public key, created) for the account seed (SA...) at `path`."""
    if path.exists() and not rotate:
        text = path.read_text().strip()
        if not text.startswith("SA"):
            raise NatsSecurityError(f"seed file {path.name}", path, "is not an account seed")
        return str(nkeys.from_seed(bytearray(text.encode())).public_key.decode()), False
    seed = bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))
    _write_secret(path, seed)
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode()), True


def provision(
    out: Path,
    nodes: tuple[str, ...],
    *,
    rotate: bool = False,
    tls: ServerTls | None = None,
    observers: tuple[str, ...] = (),
    partitions: int = 0,  # sharded aggregators: the node subject mapping (docs/scaling.md)
    auth_callout: bool = False,  # agents may also join by ServiceAccount token
) -> Provisioned:
    """Seeds for the aggregator and every node under `out`, and the server config.

    Seeds of nodes already present in `out/agents` are kept (and stay authorized) even
    when not named again, so re-running with more nodes only adds users.
    """
    for name in (*nodes, *observers):
        subjects.validate_node_name(name)
    created: list[str] = []
    kept: list[str] = []
    aggregator_seed = out / AGGREGATOR_SEED
    key, new = _ensure_seed(aggregator_seed, rotate=rotate)
    (created if new else kept).append("aggregator")
    identities = [Identity(Role.AGGREGATOR, key)]
    validation_seed = out / VALIDATION_SEED
    key, new = _ensure_seed(validation_seed, rotate=rotate)
    (created if new else kept).append("validator")
    identities.append(Identity(Role.VALIDATOR, key))
    seeds: dict[Role, dict[str, Path]] = {Role.AGENT: {}, Role.OBSERVER: {}}
    for role, directory, named in (
        (Role.AGENT, out / AGENTS_DIR, nodes),
        (Role.OBSERVER, out / OBSERVERS_DIR, observers),
    ):
        known = {p.stem for p in directory.glob("*.nk")} if directory.is_dir() else set()
        for name in sorted(known | set(named)):
            subjects.validate_node_name(name)
            path = directory / f"{name}.nk"
            key, new = _ensure_seed(path, rotate=rotate)
            (created if new else kept).append(f"{role}/{name}")
            node = name if role is Role.AGENT else None
            identities.append(Identity(role, key, node))
            seeds[role][name] = path
    issuer: str | None = None
    if auth_callout:
        key, new = _ensure_seed(out / CALLOUT_SEED, rotate=rotate)
        (created if new else kept).append("callout")
        identities.append(Identity(Role.CALLOUT, key))
        issuer, new = _ensure_account_seed(out / CALLOUT_ISSUER_SEED, rotate=rotate)
        (created if new else kept).append("callout-issuer")
    config = out / SERVER_CONFIG
    text = render_server_config(
        tuple(identities), tls=tls, partitions=partitions, callout_issuer=issuer
    )
    tmp = config.with_name(config.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(config)
    return Provisioned(
        config=config,
        aggregator_seed=aggregator_seed,
        validation_seed=validation_seed,
        agent_seeds=seeds[Role.AGENT],
        observer_seeds=seeds[Role.OBSERVER],
        created=tuple(created),
        kept=tuple(kept),
        callout_seed=out / CALLOUT_SEED if auth_callout else None,
        callout_issuer_seed=out / CALLOUT_ISSUER_SEED if auth_callout else None,
    )


def _nodes_from_file(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [s for line in lines if (s := line.split("#", 1)[0].strip())]


@click.command("nats-auth")
@click.option("--node", "nodes", multiple=True, help="An agent node to provision (repeatable).")
@click.option(
    "--nodes-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="More node names, one a line (# comments).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help=f"Directory for {SERVER_CONFIG}, {AGGREGATOR_SEED} and {AGENTS_DIR}/<node>.nk.",
)
@click.option("--observer", "observers", multiple=True,
              help="An alert reader (subscribe nicfleet.v1.alert.> only; repeatable).")  # fmt: skip
@click.option("--rotate", is_flag=True, help="Replace existing seeds with new ones.")
@click.option("--tls-cert", type=click.Path(path_type=Path, dir_okay=False),
              help="Server certificate: adds a tls block that requires client certs.")  # fmt: skip
@click.option("--tls-key", type=click.Path(path_type=Path, dir_okay=False),
              help="Server private key (with --tls-cert).")  # fmt: skip
@click.option("--tls-ca", type=click.Path(path_type=Path, dir_okay=False),
              help="CA that signs client certificates (with --tls-cert).")  # fmt: skip
@output_option("text", "json", help="json: a summary of what was written.")
@click.option("--partitions", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Map node subjects to N partitions for sharded aggregators "
              "(`run --partitions N`, docs/scaling.md).")  # fmt: skip
@click.option("--auth-callout", is_flag=True,
              help=f"Also let agents join with their ServiceAccount token: writes "
              f"{CALLOUT_SEED} and {CALLOUT_ISSUER_SEED} for `run --nats-callout-*` "
              "(docs/security.md).")  # fmt: skip
def nats_auth(
    nodes: tuple[str, ...],
    nodes_file: Path | None,
    observers: tuple[str, ...],
    out: Path,
    rotate: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_ca: Path | None,
    output: str,
    partitions: int,
    auth_callout: bool,
) -> None:
    """Write NKey seeds (aggregator + one per node) and the nats-server authorization
    config granting each agent only its own subjects. Existing seeds are kept."""
    names = list(nodes)
    if nodes_file is not None:
        try:
            names += _nodes_from_file(nodes_file)
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--nodes-file") from exc
    for flag, given in (("--node", names), ("--observer", observers)):
        for name in given:
            try:
                subjects.validate_node_name(name)
            except subjects.InvalidNodeName as exc:
                raise click.BadParameter(str(exc), param_hint=flag) from exc
    if (tls_cert is None) != (tls_key is None) or (tls_ca is not None and tls_cert is None):
        raise click.BadParameter("give --tls-cert and --tls-key (and --tls-ca) together",
                                 param_hint="--tls-cert")  # fmt: skip
    tls = None
    if tls_cert is not None and tls_key is not None:
        tls = ServerTls(cert_file=tls_cert.resolve(), key_file=tls_key.resolve(),
                        ca_file=tls_ca.resolve() if tls_ca else None)  # fmt: skip
    try:
        done = provision(out, tuple(names), rotate=rotate, tls=tls, observers=observers,
                         partitions=partitions, auth_callout=auth_callout)  # fmt: skip
    except (NatsSecurityError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if output == "json":
        click.echo(json.dumps(done.summary(), sort_keys=True))
        return
    click.echo(f"wrote {done.config} ({len(done.agent_seeds)} agents + aggregator)")
    if done.created:
        click.echo("new seeds: " + ", ".join(done.created))
