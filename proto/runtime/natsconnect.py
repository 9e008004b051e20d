"""How a nicfleet process proves who it is to NATS: NKey seed, user/password or a token
file (an agent's projected ServiceAccount token, for the auth callout), and TLS.

`NatsClientSecurity` holds the flags; `connect_options` turns it into keyword arguments
for `nats.connect` (reads the files, builds the SSL context). Bad input raises one
`NatsSecurityError` naming the flag and the path. No network, no nats import.
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from proto import subjects
from proto.errors import ProtoError


class NatsSecurityError(ProtoError, ValueError):
    """A credential or TLS setting that cannot be used; `flag` names the option."""

    def __init__(self, flag: str, path: Path | None, reason: str) -> None:
        self.flag, self.path, self.reason = flag, path, reason
        where = f" {path}" if path is not None else ""
        super().__init__(f"{flag}{where}: {reason}")


@dataclass(frozen=True, kw_only=True)
class NatsClientSecurity:
    # A user seed (SU...), one of those `nicfleet-aggregator nats-auth` writes.
    nkey_seed_file: Path | None = None
    user: str | None = None
    password_file: Path | None = None
    # A projected ServiceAccount token (audience nicfleet): read again on every (re)connect,
    # since the kubelet rotates it (docs/security.md, "zero-touch join").
    token_file: Path | None = None
    tls_ca: Path | None = None  # verify the server against this CA (TLS on)
    tls_cert: Path | None = None  # client certificate for mutual TLS
    tls_key: Path | None = None
    tls_hostname: str | None = None  # name to verify when it differs from the URL's host


NO_SECURITY = NatsClientSecurity()


def agent_inbox_prefix(node: str) -> str:
    """`_INBOX.<node token>`: an agent may subscribe only below its own inbox prefix."""
    return f"_INBOX.{subjects.node_token(node)}"


def _read(flag: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise NatsSecurityError(flag, path, exc.strerror or str(exc)) from exc


def read_user_seed(path: Path, flag: str = "--nats-nkey-seed-file") -> str:
    """The seed in `path`, checked to be a valid NATS user seed (SU...)."""
    text = _read(flag, path).decode("ascii", errors="replace").strip()
    if not text.startswith("SU"):
        raise NatsSecurityError(flag, path, "is not a NATS user seed (expected 'SU...')")
    try:
        nkeys.from_seed(text.encode())
    except Exception as exc:  # nkeys raises its own unrelated error types
        raise NatsSecurityError(flag, path, f"is not a valid NKey seed: {exc}") from exc
    return text


class TokenFile:
    """A callable nats-py calls at every CONNECT: the file's current token.

    A rotation is a rename, so a read sees the old or the new token; when the file cannot
    be read the last token read is sent (the server refuses it once it has expired).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last = self._read()

    def _read(self) -> str:
        text = _read("--nats-token-file", self.path).decode(errors="replace").strip()
        if not text:
            raise NatsSecurityError("--nats-token-file", self.path, "is empty")
        return text

    def __call__(self) -> str:
        with contextlib.suppress(NatsSecurityError):
            self._last = self._read()
        return self._last

    def __repr__(self) -> str:  # never the token
        return f"TokenFile({self.path})"


def _tls_context(security: NatsClientSecurity) -> ssl.SSLContext | None:
    if security.tls_cert is None and security.tls_key is not None:
        raise NatsSecurityError("--nats-tls-key", security.tls_key, "needs --nats-tls-cert")
    if security.tls_cert is not None and security.tls_key is None:
        raise NatsSecurityError("--nats-tls-cert", security.tls_cert, "needs --nats-tls-key")
    if security.tls_ca is None and security.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if security.tls_ca is not None:
        _read("--nats-tls-ca", security.tls_ca)
        try:
            context.load_verify_locations(cafile=str(security.tls_ca))
        except ssl.SSLError as exc:
            raise NatsSecurityError("--nats-tls-ca", security.tls_ca, str(exc)) from exc
    if security.tls_cert is not None and security.tls_key is not None:
        _read("--nats-tls-cert", security.tls_cert)
        _read("--nats-tls-key", security.tls_key)
        try:
            context.load_cert_chain(str(security.tls_cert), str(security.tls_key))
        except ssl.SSLError as exc:
            raise NatsSecurityError("--nats-tls-cert", security.tls_cert, str(exc)) from exc
    return context


def connect_options(
    security: NatsClientSecurity, *, inbox_prefix: str | None = None
) -> dict[str, Any]:
    """Keyword arguments for `nats.connect` carrying the credentials and TLS settings."""
    options: dict[str, Any] = {}
    if security.nkey_seed_file is not None and security.user is not None:
        raise NatsSecurityError("--nats-user", None, "use either an NKey seed or a user, not both")
    if security.nkey_seed_file is not None:
        read_user_seed(security.nkey_seed_file)
        options["nkeys_seed"] = str(security.nkey_seed_file)
    if security.token_file is not None:
        if security.nkey_seed_file is not None or security.user is not None:
            raise NatsSecurityError(
                "--nats-token-file", security.token_file, "use it alone, not with a seed or user"
            )
        options["token"] = TokenFile(security.token_file)
    if security.password_file is not None and security.user is None:
        raise NatsSecurityError("--nats-password-file", security.password_file, "needs --nats-user")
    if security.user is not None:
        options["user"] = security.user
        if security.password_file is not None:
            raw = _read("--nats-password-file", security.password_file)
            options["password"] = raw.decode(errors="replace").strip()
    context = _tls_context(security)
    if context is not None:
        options["tls"] = context
        if security.tls_hostname:
            options["tls_hostname"] = security.tls_hostname
    if inbox_prefix is not None:
        options["inbox_prefix"] = inbox_prefix
    return options
