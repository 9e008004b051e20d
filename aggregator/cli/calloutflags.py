"""The `--nats-callout-*` flags of `nicfleet-aggregator run`: answer nats-server's auth
callout so agents join NATS with their projected ServiceAccount token (docs/security.md).

One decorator adds them and hands the command `nats_callout` (`CalloutSettings`, or None
when the callout is off); a bad flag or seed file is one `error:` line and exit 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from aggregator.bus.authcallout import JoinSettings
from aggregator.bus.calloutservice import CalloutSettings, read_issuer_seed
from proto.runtime.natsconnect import NatsClientSecurity, NatsSecurityError, read_user_seed

EXIT_USAGE = 2
DEFAULT_AGENT_SA = "nicfleet-system:nicfleet-agent"

_FILE = click.Path(path_type=Path, dir_okay=False)
_OPTIONS = (
    click.option("--nats-callout-issuer-seed-file", type=_FILE,
                 help="Turns the auth callout on: the account seed (SA...) that signs its "
                 "answers (`nats-auth --auth-callout` writes callout-issuer.nk). Needs a "
                 "Kubernetes API server (TokenReview) and --nats-callout-nkey-seed-file."),
    click.option("--nats-callout-nkey-seed-file", type=_FILE,
                 help="The user seed the callout responder connects with (callout.nk)."),
    click.option("--nats-callout-agent-serviceaccount", default=DEFAULT_AGENT_SA,
                 show_default=True, metavar="NAMESPACE:NAME",
                 help="Only this ServiceAccount's tokens join as agents."),
    click.option("--nats-callout-audience", default="nicfleet", show_default=True,
                 help="Only tokens issued for this audience join."),
)  # fmt: skip


def nats_callout_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the flags; the command receives `nats_callout` instead of them."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        nats_callout_issuer_seed_file: Path | None,
        nats_callout_nkey_seed_file: Path | None,
        nats_callout_agent_serviceaccount: str,
        nats_callout_audience: str,
        **kwargs: Any,
    ) -> None:
        settings = None
        try:
            settings = callout_settings(
                nats_callout_issuer_seed_file,
                nats_callout_nkey_seed_file,
                nats_callout_agent_serviceaccount,
                nats_callout_audience,
            )
        except (ValueError, NatsSecurityError) as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(EXIT_USAGE) from exc
        command(*args, nats_callout=settings, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def callout_settings(
    issuer: Path | None, nkey: Path | None, serviceaccount: str, audience: str
) -> CalloutSettings | None:
    """The settings, its files checked now rather than at the first join."""
    if issuer is None:
        if nkey is not None:
            raise ValueError("--nats-callout-nkey-seed-file: needs --nats-callout-issuer-seed-file")
        return None
    if nkey is None:
        raise ValueError("--nats-callout-issuer-seed-file: needs --nats-callout-nkey-seed-file")
    namespace, sep, name = serviceaccount.partition(":")
    if not (sep and namespace and name):
        raise ValueError(
            f"--nats-callout-agent-serviceaccount: {serviceaccount!r} is not NAMESPACE:NAME"
        )
    if not audience.strip():
        raise ValueError("--nats-callout-audience: must not be empty")
    read_issuer_seed(issuer)
    read_user_seed(nkey, flag="--nats-callout-nkey-seed-file")
    return CalloutSettings(
        join=JoinSettings(namespace=namespace, service_account=name, audience=audience),
        issuer_seed_file=issuer,
        security=NatsClientSecurity(nkey_seed_file=nkey),
    )
