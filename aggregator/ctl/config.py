"""nicfleetctl's kubeconfig-style context file and where the server and token come from.

`parse_config` (pure) validates the YAML, naming file, line and field on error;
`resolve` (pure) applies flag > env > context > default. Reading and writing the file
(`load_config`, `save_config`) is the only I/O here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import click
import yaml

from aggregator.errors import AggregatorError

DEFAULT_SERVER: Final = "http://127.0.0.1:8080"
CONFIG_ENV: Final = "NICFLEET_CONFIG"
SERVER_ENV: Final = "NICFLEET_SERVER"
TOKEN_ENV: Final = "NICFLEET_TOKEN_FILE"
_TOP_KEYS: Final = ("contexts", "current-context")
_CONTEXT_KEYS: Final = ("name", "server", "token-file")


class CtlConfigError(AggregatorError, click.ClickException):
    """The context file is unreadable or invalid (exit 2, like every bad input)."""

    exit_code = 2


@dataclass(frozen=True)
class Context:
    name: str
    server: str
    token_file: str | None = None


@dataclass(frozen=True)
class Config:
    path: Path
    contexts: tuple[Context, ...] = ()
    current_context: str | None = None

    def get(self, name: str) -> Context | None:
        return next((c for c in self.contexts if c.name == name), None)


@dataclass(frozen=True)
class Settings:
    """The server and token file one invocation uses, and where each came from."""

    server: str
    server_source: str  # "--server", "NICFLEET_SERVER", "context 'x' in FILE", "default"
    token_file: str | None
    token_source: str | None
    context: str | None = None


def config_path(environ: Mapping[str, str]) -> Path:
    """$NICFLEET_CONFIG, else $XDG_CONFIG_HOME/nicfleet/config.yaml (~/.config by default)."""
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV])
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "nicfleet" / "config.yaml"


def parse_config(text: str, path: Path) -> Config:
    """Validate a context file's text; every error names `path:line` and the field."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise CtlConfigError(f"{where}: not valid YAML: {problem}") from exc
    if root is None:
        return Config(path=path)
    top = _mapping(root, path, "$")
    contexts: list[Context] = []
    current: str | None = None
    for key, value in top.items():
        if key == "contexts":
            if not isinstance(value, yaml.SequenceNode):
                raise _error(path, value, "$.contexts", "must be a list of contexts")
            contexts = [_context(item, path, i) for i, item in enumerate(value.value)]
        else:  # current-context
            current = _string(value, path, "$.current-context")
    seen: set[str] = set()
    for i, ctx in enumerate(contexts):
        if ctx.name in seen:
            node = value_of(root, "contexts")
            item = node.value[i] if isinstance(node, yaml.SequenceNode) else root
            raise _error(path, item, f"$.contexts[{i}].name", f"duplicate context {ctx.name!r}")
        seen.add(ctx.name)
    if current is not None and current not in seen:
        raise _error(
            path,
            value_of(root, "current-context") or root,
            "$.current-context",
            f"no context named {current!r} (have: {', '.join(sorted(seen)) or 'none'})",
        )
    return Config(path=path, contexts=tuple(contexts), current_context=current)


def value_of(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.value == key:
                return v  # type: ignore[no-any-return]
    return None


def _context(node: yaml.Node, path: Path, index: int) -> Context:
    where = f"$.contexts[{index}]"
    fields = _mapping(node, path, where, allowed=_CONTEXT_KEYS)
    for required in ("name", "server"):
        if required not in fields:
            raise _error(path, node, f"{where}.{required}", "is required")
    name = _string(fields["name"], path, f"{where}.name")
    server = _string(fields["server"], path, f"{where}.server")
    if not is_server_url(server):
        raise _error(path, fields["server"], f"{where}.server", f"{server!r} is not an http(s) URL")
    token = fields.get("token-file")
    token_file = _string(token, path, f"{where}.token-file") if token is not None else None
    if token_file is not None and not os.path.isabs(os.path.expanduser(token_file)):
        token_file = str(path.parent / token_file)  # relative to the file, as kubeconfig does
    return Context(name=name, server=server, token_file=token_file)


def _mapping(
    node: yaml.Node, path: Path, where: str, allowed: tuple[str, ...] = _TOP_KEYS
) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise _error(path, node, where, "must be a mapping")
    fields: dict[str, yaml.Node] = {}
    for key, value in node.value:
        name = str(key.value)
        if name not in allowed:
            raise _error(
                path, key, f"{where}.{name}", f"unknown key; expected one of {', '.join(allowed)}"
            )
        if name in fields:
            raise _error(path, key, f"{where}.{name}", "given twice")
        fields[name] = value
    return fields


def _string(node: yaml.Node, path: Path, where: str) -> str:
    if (
        not isinstance(node, yaml.ScalarNode)
        or node.tag != "tag:yaml.org,2002:str"
        or not node.value
    ):
        raise _error(path, node, where, "must be a non-empty string")
    return str(node.value)


def _error(path: Path, node: yaml.Node, field: str, reason: str) -> CtlConfigError:
    return CtlConfigError(f"{path}:{node.start_mark.line + 1}: {field}: {reason}")


def is_server_url(value: str) -> bool:
    return value.startswith(("http://", "https://")) and bool(value.split("://", 1)[1])


def resolve(
    *,
    server_flag: str | None,
    server_env: str | None,
    token_flag: str | None,
    token_env: str | None,
    config: Config | None,
    context: str | None = None,
) -> Settings:
    """Precedence for each of server and token file: flag > env > context > default."""
    chosen: Context | None = None
    if config is not None:
        name = context or config.current_context
        if name is not None:
            chosen = config.get(name)
            if chosen is None:
                have = ", ".join(c.name for c in config.contexts) or "none"
                raise CtlConfigError(f"{config.path}: no context named {name!r} (have: {have})")
    elif context is not None:
        raise CtlConfigError(f"--context {context}: there is no context file")
    where = f"context {chosen.name!r} in {config.path}" if chosen and config else None
    if server_flag is not None:
        server, server_source = server_flag, "--server"
    elif server_env:
        server, server_source = server_env, SERVER_ENV
    elif chosen is not None and where is not None:
        server, server_source = chosen.server, where
    else:
        server, server_source = DEFAULT_SERVER, "default"
    token: str | None = None
    token_source: str | None = None
    if token_flag is not None:
        token, token_source = token_flag, "--token-file"
    elif token_env:
        token, token_source = token_env, TOKEN_ENV
    elif chosen is not None and chosen.token_file is not None:
        token, token_source = chosen.token_file, where
    return Settings(server, server_source, token, token_source, chosen.name if chosen else None)


def settings_from(
    *,
    server_flag: str | None,
    token_flag: str | None,
    context: str | None,
    environ: Mapping[str, str],
) -> Settings:
    """Read the context file (if any) and resolve; env values are validated like flags."""
    settings = resolve(
        server_flag=server_flag,
        server_env=environ.get(SERVER_ENV),
        token_flag=token_flag,
        token_env=environ.get(TOKEN_ENV),
        config=load_config(config_path(environ)),
        context=context,
    )
    if not is_server_url(settings.server):
        raise CtlConfigError(f"{settings.server_source}: {settings.server!r} is not an http(s) URL")
    return settings


def load_config(path: Path) -> Config | None:
    """The context file at `path`, or None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CtlConfigError(f"{path}: cannot read the context file: {reason}") from exc
    return parse_config(text, path)


def save_config(config: Config) -> None:
    """Write `config` back (0600, atomically via a sibling temporary file)."""
    doc: dict[str, object] = {
        "contexts": [
            {"name": c.name, "server": c.server}
            | ({"token-file": c.token_file} if c.token_file else {})
            for c in config.contexts
        ]
    }
    if config.current_context is not None:
        doc["current-context"] = config.current_context
    config.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = config.path.with_name(config.path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        yaml.safe_dump(doc, file, sort_keys=False)
    os.replace(tmp, config.path)


def with_context(config: Config, ctx: Context) -> Config:
    """`config` with `ctx` added, or replacing the context of the same name."""
    contexts = [c for c in config.contexts if c.name != ctx.name]
    index = next((i for i, c in enumerate(config.contexts) if c.name == ctx.name), len(contexts))
    contexts.insert(index, ctx)
    return replace(config, contexts=tuple(contexts))
