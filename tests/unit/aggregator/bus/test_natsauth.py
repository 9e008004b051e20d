"""NATS identities: the permission table per role, the rendered server config (checked by
nats-server itself), seed files (0600, kept, rotated) and bad credential input."""

from __future__ import annotations

import json
import ssl
import stat
import subprocess
from pathlib import Path

import nkeys
import pytest
import trustme
from click.testing import CliRunner

from agent.cli import main as agent_main
from aggregator.bus.keys import new_user_seed, provision, public_key
from aggregator.bus.natsserver import find_nats_server
from aggregator.bus.permissions import (
    Identity,
    Permissions,
    Role,
    ServerTls,
    agent_permissions,
    aggregator_permissions,
    partition_mappings,
    permissions_for,
    render_mappings_config,
    render_server_config,
)
from aggregator.cli.main import main as aggregator_main
from proto.runtime.natsconnect import (
    NatsClientSecurity,
    NatsSecurityError,
    agent_inbox_prefix,
    connect_options,
)
from proto.subjects import InvalidNodeName

KEY = public_key(new_user_seed())


@pytest.mark.parametrize(
    ("identity", "expected"),
    [
        pytest.param(
            Identity(Role.AGENT, KEY, "gpu-01"),
            Permissions(
                publish_allow=(
                    "nicfleet.v1.node.gpu-01.>",
                    "nicfleet.v1.desired.gpu-01.get",
                    "nicfleet.v1.draclaims.gpu-01.get",
                ),
                subscribe_allow=(
                    "_INBOX.gpu-01.>",
                    "nicfleet.v1.control.resync",
                    "nicfleet.v1.desired.gpu-01",
                ),
            ),
            id="agent",
        ),
        pytest.param(
            Identity(Role.AGENT, KEY, "rack1.gpu-01"),
            Permissions(
                publish_allow=(
                    "nicfleet.v1.node.rack1_gpu-01.>",
                    "nicfleet.v1.desired.rack1_gpu-01.get",
                    "nicfleet.v1.draclaims.rack1_gpu-01.get",
                ),
                subscribe_allow=(
                    "_INBOX.rack1_gpu-01.>",
                    "nicfleet.v1.control.resync",
                    "nicfleet.v1.desired.rack1_gpu-01",
                ),
            ),
            id="agent-dotted-node-is-one-token",
        ),
        pytest.param(
            Identity(Role.AGGREGATOR, KEY),
            Permissions(
                publish_allow=(
                    "$JS.API.>",
                    "$KV.>",
                    "$JS.ACK.>",
                    "$JS.FC.>",
                    "nicfleet.v1.alert.>",
                    "nicfleet.v1.control.resync",
                    "nicfleet.v1.shard.*.summary",
                    "nicfleet.v1.desired.*",
                    "_INBOX.>",
                ),
                publish_deny=("nicfleet.v1.node.>", "nicfleet.v1.part.>"),
                subscribe_allow=(
                    "nicfleet.v1.node.>",
                    "_INBOX.>",
                    "nicfleet.v1.part.>",
                    "nicfleet.v1.shard.*.summary",
                    "nicfleet.v1.validation.*",
                    "nicfleet.v1.desired.*.get",
                    "nicfleet.v1.draclaims.*.get",
                ),
            ),
            id="aggregator-never-publishes-node-subjects",
        ),
        pytest.param(
            Identity(Role.OBSERVER, KEY),
            Permissions(publish_deny=(">",), subscribe_allow=("nicfleet.v1.alert.>",)),
            id="observer-reads-alerts-only",
        ),
    ],
)
def test_permissions_per_role(identity: Identity, expected: Permissions) -> None:
    assert permissions_for(identity) == expected


def test_agent_inbox_matches_its_subscribe_permission() -> None:
    assert agent_permissions("a.b").subscribe_allow[0] == f"{agent_inbox_prefix('a.b')}.>"
    assert not any(s.startswith("nicfleet.v1.node") for s in aggregator_permissions().publish_allow)


def test_agents_hold_no_jetstream_api_and_only_their_own_desired_subjects() -> None:
    agent = agent_permissions("gpu-01", partitioned=True)
    granted = (*agent.publish_allow, *agent.subscribe_allow)
    assert not any(s.startswith(("$JS", "$KV", "$SYS", ">", "*")) for s in granted)
    assert not any("*" in s.split(".")[3:4] for s in granted if "desired" in s)
    aggregator = aggregator_permissions()
    assert "nicfleet.v1.desired.*" in aggregator.publish_allow  # 4 tokens: not the .get
    assert "nicfleet.v1.desired.*.get" in aggregator.subscribe_allow


def test_resync_requests_flow_from_the_aggregator_to_agents_only() -> None:
    agent = agent_permissions("gpu-01")
    assert "nicfleet.v1.control.resync" in agent.subscribe_allow
    assert not any(s.startswith("nicfleet.v1.control") for s in agent.publish_allow)
    assert not any(s.endswith(">") and s.startswith("nicfleet") for s in agent.subscribe_allow)
    assert "nicfleet.v1.control.resync" in aggregator_permissions().publish_allow
    assert permissions_for(Identity(Role.OBSERVER, KEY)).publish_deny == (">",)


@pytest.mark.parametrize("node", ["", "UPPER", "a*", "a>b", "-x", "a b", "x" * 254])
def test_bad_node_names_are_refused(node: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidNodeName):
        agent_permissions(node)
    with pytest.raises(InvalidNodeName):
        provision(tmp_path, (node,))
    assert not (tmp_path / "server-auth.conf").exists()


@pytest.mark.parametrize(
    ("identities", "message"),
    [
        pytest.param((), "no identities", id="empty"),
        pytest.param(
            (Identity(Role.AGGREGATOR, KEY), Identity(Role.AGENT, KEY, "n1")),
            "twice",
            id="duplicate-key",
        ),
        pytest.param((Identity(Role.AGGREGATOR, "SUABC"),), "not an NKey user", id="seed-not-key"),
        pytest.param((Identity(Role.AGENT, KEY),), "needs its node", id="agent-without-node"),
    ],
)
def test_render_refuses_bad_identities(identities: tuple[Identity, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_server_config(identities)


def nats_server_accepts(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_nats_server()), "-c", str(config), "-t"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_rendered_config_is_json_nats_server_accepts(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    files = {n: tmp_path / f"{n}.pem" for n in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    tls = ServerTls(cert_file=files["cert"], key_file=files["key"], ca_file=files["ca"])
    done = provision(tmp_path / "auth", ("n1", "n2.rack"), tls=tls)
    doc = json.loads(done.config.read_text())
    assert "no_auth_user" not in json.dumps(doc)  # anonymous clients are refused
    users = doc["authorization"]["users"]
    assert len(users) == 4  # aggregator, validator (validation pods), n1, n2.rack
    assert all(set(u) == {"nkey", "permissions"} for u in users)  # public keys, never seeds
    assert not any(str(u["nkey"]).startswith("S") for u in users)
    assert doc["tls"]["verify"] is True and doc["tls"]["ca_file"] == str(files["ca"])
    checked = nats_server_accepts(done.config)
    assert checked.returncode == 0, checked.stderr


def test_seeds_are_private_kept_added_and_rotated(tmp_path: Path) -> None:
    out = tmp_path / "auth"
    first = provision(out, ("n1",))
    seeds = [first.aggregator_seed, first.validation_seed, first.agent_seeds["n1"]]
    for path in seeds:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().startswith("SU")
    before = {p: p.read_bytes() for p in seeds}
    second = provision(out, ("n2",))  # n1 is not named again, yet stays authorized
    assert {p: p.read_bytes() for p in seeds} == before
    assert set(second.agent_seeds) == {"n1", "n2"}
    assert second.created == ("agent/n2",)
    users = json.loads(second.config.read_text())["authorization"]["users"]
    nkeys_in_config = {u["nkey"] for u in users}
    assert public_key(seeds[2].read_bytes().strip()) in nkeys_in_config
    third = provision(out, (), rotate=True)
    assert all(p.read_bytes() != before[p] for p in seeds)
    assert set(third.created) == {"aggregator", "validator", "agent/n1", "agent/n2"}


def test_cli_writes_and_summarizes(tmp_path: Path) -> None:
    nodes_file = tmp_path / "nodes.txt"
    nodes_file.write_text("# the fleet\nn2\n\nn3  # rack 3\n")
    result = CliRunner().invoke(
        aggregator_main,
        ["nats-auth", "--node", "n1", "--nodes-file", str(nodes_file), "--out", str(tmp_path / "o"),
         "--observer", "pager", "-o", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert sorted(summary["agent_seeds"]) == ["n1", "n2", "n3"]
    assert sorted(summary["observer_seeds"]) == ["pager"]
    users = json.loads(Path(summary["config"]).read_text())["authorization"]["users"]
    assert len(users) == 6  # aggregator, validator, three agents, one observer
    assert Path(summary["config"]).is_file()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        pytest.param(["--node", "Bad_Name"], "--node", id="bad-node"),
        pytest.param(["--observer", "a.*"], "--observer", id="bad-observer"),
        pytest.param(["--nodes-file", "/nonexistent/nodes"], "--nodes-file", id="missing-file"),
        pytest.param(["--node", "n1", "--tls-cert", "c.pem"], "--tls-cert", id="cert-no-key"),
    ],
)
def test_cli_bad_input_names_the_flag(args: list[str], flag: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(aggregator_main, ["nats-auth", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert flag in result.output
    assert not (tmp_path / "server-auth.conf").exists()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def bad_security(tmp: Path) -> list[tuple[str, NatsClientSecurity, str, str]]:
    account_seed = nkeys.encode_seed(b"\x01" * 32, nkeys.PREFIX_BYTE_ACCOUNT)
    pem = write(tmp / "junk.pem", b"not a certificate\n")
    missing = tmp / "missing.nk"
    return [
        (
            "missing-seed",
            NatsClientSecurity(nkey_seed_file=missing),
            "--nats-nkey-seed-file",
            str(missing),
        ),
        (
            "account-seed",
            NatsClientSecurity(nkey_seed_file=write(tmp / "acct.nk", account_seed)),
            "--nats-nkey-seed-file",
            "user seed",
        ),
        (
            "garbage-seed",
            NatsClientSecurity(nkey_seed_file=write(tmp / "g.nk", b"SUxx!!")),
            "--nats-nkey-seed-file",
            "not a valid",
        ),
        (
            "cert-without-key",
            NatsClientSecurity(tls_cert=pem),
            "--nats-tls-cert",
            "needs --nats-tls-key",
        ),
        (
            "key-without-cert",
            NatsClientSecurity(tls_key=pem),
            "--nats-tls-key",
            "needs --nats-tls-cert",
        ),
        ("ca-not-pem", NatsClientSecurity(tls_ca=pem), "--nats-tls-ca", str(pem)),
        ("missing-ca", NatsClientSecurity(tls_ca=missing), "--nats-tls-ca", str(missing)),
        (
            "password-without-user",
            NatsClientSecurity(password_file=pem),
            "--nats-password-file",
            "needs --nats-user",
        ),
        (
            "seed-and-user",
            NatsClientSecurity(nkey_seed_file=pem, user="u"),
            "--nats-user",
            "not both",
        ),
    ]


def test_bad_credentials_name_the_flag_and_path(tmp_path: Path) -> None:
    for case, security, flag, detail in bad_security(tmp_path):
        with pytest.raises(NatsSecurityError) as caught:
            connect_options(security)
        assert caught.value.flag == flag, case
        assert str(caught.value).startswith(flag), case
        assert detail in str(caught.value), case


def test_good_credentials_become_connect_options(tmp_path: Path) -> None:
    seed = write(tmp_path / "a.nk", new_user_seed() + b"\n")
    ca = trustme.CA()
    leaf = ca.issue_cert("n1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "c.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "k.pem"))
    security = NatsClientSecurity(
        nkey_seed_file=seed,
        tls_ca=tmp_path / "ca.pem",
        tls_cert=tmp_path / "c.pem",
        tls_key=tmp_path / "k.pem",
        tls_hostname="nats.example",
    )
    options = connect_options(security, inbox_prefix=agent_inbox_prefix("n1"))
    assert options["nkeys_seed"] == str(seed)
    assert options["inbox_prefix"] == "_INBOX.n1"
    assert options["tls_hostname"] == "nats.example"
    context = options["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert connect_options(NatsClientSecurity()) == {}


def test_agent_run_refuses_a_bad_seed_before_connecting(tmp_path: Path) -> None:
    missing = tmp_path / "nope.nk"
    result = CliRunner().invoke(
        agent_main,
        ["run", "--nats-url", "nats://127.0.0.1:1", "--nats-nkey-seed-file", str(missing),
         "--sysfs-root", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert f"error: --nats-nkey-seed-file {missing}:" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--nats-tls-cert", "/nonexistent/c.pem"], "--nats-tls-cert /nonexistent/c.pem: needs"
        ),
        pytest.param(
            ["--nats-url", "nats://127.0.0.1:1", "--nats-server-config", __file__],
            "--nats-server-config: only for the embedded server",
        ),
    ],
)
def test_aggregator_run_refuses_bad_nats_settings(args: list[str], message: str) -> None:
    result = CliRunner().invoke(aggregator_main, ["run", *args])
    assert result.exit_code == 2
    assert f"error: {message}" in result.output


def test_partition_mapping_spreads_node_subjects_by_node_token() -> None:
    assert partition_mappings(0) == {}
    assert partition_mappings(12) == {
        "nicfleet.v1.node.*.*": "nicfleet.v1.part.{{partition(12,1)}}.node.{{wildcard(1)}}"
        ".{{wildcard(2)}}"
    }
    assert json.loads(render_mappings_config(3))["mappings"] == partition_mappings(3)


@pytest.mark.parametrize("partitions", [-1, 1025])
def test_partition_count_out_of_range_is_refused(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions"):
        partition_mappings(partitions)


def test_partitioned_config_lets_agents_publish_their_own_mapped_subjects() -> None:
    """nats-server checks publish permissions on the mapped subject (tests/integration/
    test_shards.py), so an agent may publish its own node's partition subjects only."""
    agent = Identity(Role.AGENT, "U" + "A" * 55, "rack1.gpu-01")
    doc = json.loads(render_server_config((agent,), partitions=12))
    assert doc["mappings"] == partition_mappings(12)
    allowed = doc["authorization"]["users"][0]["permissions"]["publish"]["allow"]
    assert "nicfleet.v1.part.*.node.rack1_gpu-01.>" in allowed
    plain = json.loads(render_server_config((agent,)))
    assert "mappings" not in plain
    assert not any(".part." in s for s in plain["authorization"]["users"][0]["permissions"]
                   ["publish"]["allow"])  # fmt: skip
