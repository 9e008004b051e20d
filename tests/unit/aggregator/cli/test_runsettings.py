"""`nicfleet-aggregator run`'s flags → AggregatorSettings (aggregator.cli.runsettings, pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.api.auth import ApiAuth
from aggregator.api.tokenreview import ReviewSettings
from aggregator.cli.runsettings import FlagError, RunFlags, aggregator_settings, read_policies
from aggregator.cli.validationflags import ValidationFlags

POLICY = Path("policy.yaml")  # never read: aggregator_settings takes the parsed policies
REVIEW = ReviewSettings()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(
            RunFlags(nats_url="nats://n:4222", nats_server_config=Path("s.conf")),
            "--nats-server-config: only for the embedded server (no --nats-url)",
            id="server-config-with-url",
        ),
        pytest.param(
            RunFlags(in_cluster=True, kube_api="http://k"),
            "use only one of --kubeconfig, --in-cluster and --kube-api",
            id="two-clusters",
        ),
        pytest.param(
            RunFlags(kube_context="prod"),
            "--kube-context: needs --kubeconfig",
            id="context-without-kubeconfig",
        ),
        pytest.param(
            RunFlags(api_token_review=REVIEW),
            "--api-token-review: needs --in-cluster, --kubeconfig or --kube-api",
            id="review-without-cluster",
        ),
        pytest.param(
            RunFlags(in_cluster=True, policy_file=POLICY),
            "--policy: with a cluster, policies come from NicFleetPolicy objects",
            id="policy-file-with-cluster",
        ),
        pytest.param(
            RunFlags(dra_publish=True),
            "--dra-publish: needs --in-cluster, --kubeconfig or --kube-api",
            id="dra-publish-without-cluster",
        ),
    ],
)
def test_flags_that_cannot_work_together(flags: RunFlags, message: str) -> None:
    with pytest.raises(FlagError) as raised:
        aggregator_settings(flags)
    assert str(raised.value) == message


def test_defaults_are_one_open_process_with_an_embedded_server() -> None:
    settings = aggregator_settings(RunFlags())
    assert settings.nats_url is None and settings.kube is None and settings.api_auth is None
    assert (settings.listen_host, settings.listen_port) == ("127.0.0.1", 8080)
    assert settings.alerts.alertmanager is None
    assert settings.shards.partitions == 0
    assert settings.dra_publish is False
    assert aggregator_settings(RunFlags(in_cluster=True, dra_publish=True)).dra_publish


def test_every_flag_lands_in_its_setting() -> None:
    flags = RunFlags(
        nats_url="nats://n:4222",
        listen=("::", 0),
        stale_after=12.0,
        ready_file=Path("ready.json"),
        alertmanager_url="http://am:9093",
        kube_api="http://k:8001",
        identity="agg-0",
        kv_replicas=3,
        partitions=12,
        api_token_review=REVIEW,
        metrics_public=True,
        validation_flags=ValidationFlags(namespace="checks", nats_url="tls://n:4222"),
    )
    settings = aggregator_settings(flags)
    assert (settings.listen_host, settings.listen_port) == ("::", 0)
    assert settings.stale_after == 12.0 and settings.identity == "agg-0"
    assert settings.alerts.alertmanager is not None
    assert settings.alerts.alertmanager.url == "http://am:9093"
    assert settings.kube is not None and settings.kube.host == "http://k:8001"
    assert settings.kube.validation_namespace == "checks"
    assert settings.validation.nats_url == "tls://n:4222"
    assert (settings.shards.partitions, settings.shards.replicas, settings.kv_replicas) == (
        12,
        3,
        3,
    )
    # TokenReview alone still authenticates: an ApiAuth with no tokens of its own.
    assert settings.api_auth == ApiAuth(tokens=(), metrics_public=True)
    assert settings.api_token_review is REVIEW


def test_a_token_file_is_kept_next_to_token_review() -> None:
    from_file = ApiAuth(tokens=(), metrics_public=False)
    settings = aggregator_settings(
        RunFlags(in_cluster=True, api_token_review=REVIEW), api_auth=from_file
    )
    assert settings.api_auth is from_file


def test_an_unreadable_policy_file_is_a_flag_error(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("kind: [unclosed")
    with pytest.raises(FlagError, match=r"^--policy: "):
        read_policies(bad)
    assert read_policies(None) == ()
