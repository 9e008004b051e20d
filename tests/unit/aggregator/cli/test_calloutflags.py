"""`run --nats-callout-*` and `nats-auth --auth-callout`: the flags become `CalloutSettings`
(files checked at start), bad combinations are one error naming the flag, the callout
needs a cluster, and the provisioned seeds and config carry the auth_callout block."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from aggregator.bus.keys import provision
from aggregator.cli.calloutflags import callout_settings
from aggregator.cli.runsettings import FlagError, RunFlags, aggregator_settings

SA = "nicfleet-system:nicfleet-agent"


@pytest.fixture
def seeds(tmp_path: Path) -> tuple[Path, Path]:
    done = provision(tmp_path / "auth", (), auth_callout=True)
    assert done.callout_issuer_seed is not None and done.callout_seed is not None
    return done.callout_issuer_seed, done.callout_seed


def test_flags_become_settings(seeds: tuple[Path, Path]) -> None:
    issuer, nkey = seeds
    settings = callout_settings(issuer, nkey, "ops:agents", "fleet")
    assert settings is not None
    assert settings.join.username == "system:serviceaccount:ops:agents"
    assert settings.join.audience == "fleet"
    assert settings.security.nkey_seed_file == nkey
    assert callout_settings(None, None, SA, "nicfleet") is None  # off by default


@pytest.mark.parametrize(
    ("which", "serviceaccount", "audience", "flag"),
    [
        pytest.param("nkey-only", SA, "nicfleet", "--nats-callout-nkey-seed-file", id="nkey-alone"),
        pytest.param(
            "issuer-only", SA, "nicfleet", "--nats-callout-issuer-seed-file", id="issuer-alone"
        ),
        pytest.param(
            "both",
            "nicfleet-agent",
            "nicfleet",
            "--nats-callout-agent-serviceaccount",
            id="no-namespace",
        ),
        pytest.param("both", SA, " ", "--nats-callout-audience", id="empty-audience"),
        pytest.param(
            "swapped", SA, "nicfleet", "--nats-callout-issuer-seed-file", id="user-seed-as-issuer"
        ),
    ],
)
def test_bad_flags_name_the_flag(
    seeds: tuple[Path, Path], which: str, serviceaccount: str, audience: str, flag: str
) -> None:
    issuer, nkey = seeds
    given = {"nkey-only": (None, nkey), "issuer-only": (issuer, None), "both": (issuer, nkey),
             "swapped": (nkey, nkey)}[which]  # fmt: skip
    with pytest.raises(ValueError, match=flag):
        callout_settings(*given, serviceaccount, audience)


def test_the_callout_needs_a_cluster(seeds: tuple[Path, Path]) -> None:
    settings = callout_settings(*seeds, SA, "nicfleet")
    with pytest.raises(FlagError, match="--nats-callout-issuer-seed-file: needs --in-cluster"):
        aggregator_settings(RunFlags(nats_callout=settings))
    done = aggregator_settings(RunFlags(nats_callout=settings, in_cluster=True))
    assert done.nats_callout == settings


def test_provisioning_writes_private_seeds_and_the_callout_block(tmp_path: Path) -> None:
    out = tmp_path / "auth"
    first = provision(out, ("n1",), auth_callout=True)
    assert first.callout_seed is not None and first.callout_issuer_seed is not None
    assert first.callout_issuer_seed.read_text().startswith("SA")
    for seed in (first.callout_seed, first.callout_issuer_seed):
        assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    block = json.loads(first.config.read_text())["authorization"]["auth_callout"]
    users = json.loads(first.config.read_text())["authorization"]["users"]
    assert sorted(block["auth_users"]) == sorted(u["nkey"] for u in users)  # all bypass it
    assert block["issuer"].startswith("A")
    again = provision(out, ("n1",), auth_callout=True)
    assert {"callout", "callout-issuer"} <= set(again.kept)
    assert json.loads(again.config.read_text()) == json.loads(first.config.read_text())
    plain = provision(tmp_path / "plain", ("n1",))
    assert "auth_callout" not in json.loads(plain.config.read_text())["authorization"]
    assert "callout_seed" not in plain.summary()
