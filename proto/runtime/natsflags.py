"""The `--nats-*` credential and TLS flags, shared by the agent's and the aggregator's `run`.

One decorator adds the flags and hands the command a checked `nats_security`
(`NatsClientSecurity`); a bad file is one `error: --flag path: reason` line and exit 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from proto.runtime.natsconnect import NatsClientSecurity, NatsSecurityError, connect_options

EXIT_USAGE = 2

_FILE = click.Path(path_type=Path, dir_okay=False)
_OPTIONS = (
    click.option("--nats-nkey-seed-file", type=_FILE,
                 help="NKey user seed (SU...) to authenticate to NATS with "
                 "(`nicfleet-aggregator nats-auth` writes them)."),
    click.option("--nats-user", help="NATS user name (instead of an NKey seed)."),
    click.option("--nats-token-file", type=_FILE,
                 help="Token to authenticate with, read again at every reconnect: the "
                 "agent's projected ServiceAccount token for the aggregator's auth callout."),
    click.option("--nats-password-file", type=_FILE, help="File holding --nats-user's password."),
    click.option("--nats-tls-ca", type=_FILE,
                 help="CA file to verify the NATS server with (turns TLS on)."),
    click.option("--nats-tls-cert", type=_FILE,
                 help="Client certificate for mutual TLS (with --nats-tls-key)."),
    click.option("--nats-tls-key", type=_FILE, help="Private key of --nats-tls-cert."),
    click.option("--nats-tls-hostname",
                 help="Server name to verify when it differs from the URL's host."),
)  # fmt: skip


def nats_security_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the flags; the command receives `nats_security` instead of them."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        nats_nkey_seed_file: Path | None,
        nats_user: str | None,
        nats_password_file: Path | None,
        nats_token_file: Path | None,
        nats_tls_ca: Path | None,
        nats_tls_cert: Path | None,
        nats_tls_key: Path | None,
        nats_tls_hostname: str | None,
        **kwargs: Any,
    ) -> None:
        security = NatsClientSecurity(
            nkey_seed_file=nats_nkey_seed_file,
            user=nats_user,
            password_file=nats_password_file,
            token_file=nats_token_file,
            tls_ca=nats_tls_ca,
            tls_cert=nats_tls_cert,
            tls_key=nats_tls_key,
            tls_hostname=nats_tls_hostname,
        )
        try:
            connect_options(security)  # reads and checks every file now, not at connect
        except NatsSecurityError as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(EXIT_USAGE) from exc
        command(*args, nats_security=security, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper
