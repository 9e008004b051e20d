"""`nicfleet-aggregator run`'s flags turned into `AggregatorSettings`.

`aggregator_settings` is pure (flags and already-read files in, settings or a `FlagError`
out); `read_policies`/`read_api_auth` read the files the flags name and `announce_auth`
logs what the API will require. Exiting and printing stay in `aggregator.cli.main`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from aggregator.alerts.alertmanager import AlertmanagerSettings
from aggregator.alerts.wiring import AlertWiring
from aggregator.api.auth import ApiAuth, TokenFileError, load_token_file
from aggregator.api.limits import HttpLimitSettings
from aggregator.api.tokenreview import ReviewSettings
from aggregator.bus.calloutservice import CalloutSettings
from aggregator.cli.validationflags import ValidationFlags, with_validation_flags
from aggregator.errors import AggregatorError
from aggregator.kube.client import KubeSettings
from aggregator.replicas.partitions import ShardSettings
from aggregator.service import AggregatorSettings
from proto.policy import Policy, PolicyError, load_policies
from proto.runtime.natsconnect import NatsClientSecurity

log = logging.getLogger(__name__)


class FlagError(AggregatorError, ValueError):
    """Flags that cannot work together, or a file a flag names that cannot be used; the
    message starts with the flag (printed as `error: <message>`, exit code 2)."""


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """`run`'s options as click parsed them (the logging ones excepted)."""

    nats_url: str | None = None
    nats_security: NatsClientSecurity = dataclasses.field(default_factory=NatsClientSecurity)
    nats_server_config: Path | None = None
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    policy_file: Path | None = None
    stale_after: float = 30.0
    nats_store_dir: Path | None = None
    ready_file: Path | None = None
    alertmanager_url: str | None = None
    kubeconfig: Path | None = None
    kube_context: str | None = None
    in_cluster: bool = False
    kube_api: str | None = None
    identity: str | None = None
    kv_replicas: int = 1
    validation_flags: ValidationFlags = dataclasses.field(default_factory=ValidationFlags)
    partitions: int = 0
    api_token_file: Path | None = None
    metrics_public: bool = False
    api_token_review: ReviewSettings | None = None
    http: HttpLimitSettings = dataclasses.field(default_factory=HttpLimitSettings)
    nats_callout: CalloutSettings | None = None
    dra_publish: bool = False


def aggregator_settings(
    flags: RunFlags, *, policies: tuple[Policy, ...] = (), api_auth: ApiAuth | None = None
) -> AggregatorSettings:
    """The settings these flags ask for (`policies`: the --policy file's, `api_auth`: the
    --api-token-file's, both read already). Pure: raises FlagError, prints nothing."""
    if flags.nats_server_config is not None and flags.nats_url is not None:
        raise FlagError("--nats-server-config: only for the embedded server (no --nats-url)")
    kube_api = flags.kube_api is not None
    ways = [w for w in (flags.kubeconfig is not None, flags.in_cluster, kube_api) if w]
    if len(ways) > 1:
        raise FlagError("use only one of --kubeconfig, --in-cluster and --kube-api")
    if flags.kube_context is not None and flags.kubeconfig is None:
        raise FlagError("--kube-context: needs --kubeconfig")
    if flags.api_token_review is not None:
        if not ways:
            raise FlagError("--api-token-review: needs --in-cluster, --kubeconfig or --kube-api")
        api_auth = api_auth or ApiAuth(tokens=(), metrics_public=flags.metrics_public)
    if flags.nats_callout is not None and not ways:
        raise FlagError(
            "--nats-callout-issuer-seed-file: needs --in-cluster, --kubeconfig or --kube-api"
        )
    if flags.dra_publish and not ways:
        raise FlagError("--dra-publish: needs --in-cluster, --kubeconfig or --kube-api")
    if ways and flags.policy_file is not None:
        raise FlagError("--policy: with a cluster, policies come from NicFleetPolicy objects")
    kube = KubeSettings(
        host=flags.kube_api, kubeconfig=flags.kubeconfig, context=flags.kube_context,
        in_cluster=flags.in_cluster,
    ) if ways else None  # fmt: skip
    url = flags.alertmanager_url
    settings = AggregatorSettings(
        kube=kube,
        nats_url=flags.nats_url,
        nats_security=flags.nats_security,
        nats_server_config=flags.nats_server_config,
        listen_host=flags.listen[0],
        listen_port=flags.listen[1],
        stale_after=flags.stale_after,
        nats_store_dir=flags.nats_store_dir,
        ready_file=flags.ready_file,
        policies=policies,
        policy_file=flags.policy_file,
        api_auth=api_auth,
        api_token_review=flags.api_token_review,
        shards=ShardSettings(partitions=flags.partitions, replicas=flags.kv_replicas),
        kv_replicas=flags.kv_replicas,
        alerts=AlertWiring(alertmanager=AlertmanagerSettings(url=url) if url else None),
        http=flags.http,
        nats_callout=flags.nats_callout,
        dra_publish=flags.dra_publish,
    )
    if flags.identity:
        settings = dataclasses.replace(settings, identity=flags.identity)
    return with_validation_flags(settings, flags.validation_flags)


def read_policies(path: Path | None) -> tuple[Policy, ...]:
    if path is None:
        return ()
    try:
        return load_policies(path.read_text(), source=str(path))
    except (PolicyError, OSError, UnicodeDecodeError) as exc:
        raise FlagError(f"--policy: {exc}") from exc


def read_api_auth(flags: RunFlags) -> ApiAuth | None:
    """The --api-token-file's tokens (None without one)."""
    if flags.api_token_file is None:
        return None
    try:
        return load_token_file(flags.api_token_file, metrics_public=flags.metrics_public)
    except TokenFileError as exc:
        raise FlagError(f"--api-token-file: {exc}") from exc


def announce_auth(flags: RunFlags, from_file: ApiAuth | None) -> None:
    """Log what the API requires: tokens from the file, TokenReview, or nothing (open)."""
    review = flags.api_token_review
    if from_file is not None:
        counts = from_file.counts()
        log.info(
            "API authentication on: %d read and %d admin tokens from %s; /metrics %s",
            counts["read"], counts["admin"], flags.api_token_file,
            "public" if flags.metrics_public else "needs a token",
        )  # fmt: skip
    elif review is None:
        log.warning("API authentication off: the HTTP API is open")
    if review is not None:
        log.info(
            "API authentication on: TokenReview; read: %s, admin: %s",
            ", ".join(review.read_groups + review.read_users),
            ", ".join(review.admin_groups + review.admin_users),
        )
