"""nicfleetctl's global options, kubectl-style: `--server`, `--token-file`, `--context` and
`-o` work before the command (`nicfleetctl --server URL nodes`) and after it (`nicfleetctl
nodes --server URL`); given twice, the later one wins.

The group and every command record what they were given in the invocation's `meta`;
`add_global_options` wraps each command so that, once all of its arguments are parsed, the
settings are resolved (flag > env > context file > default, `config.resolve`) and the
token read. Commands that need no server do not read the context file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any, Final

import click
from click.core import ParameterSource

from aggregator.ctl.client import (
    DEFAULT_SERVER,
    SETTINGS_META_KEY,
    TOKEN_META_KEY,
    read_token_file,
)
from aggregator.ctl.config import is_server_url, settings_from

GIVEN_META_KEY: Final = "nicfleet.global-options"
SERVER_HELP: Final = "Base URL of the nicfleet aggregator API. Else env NICFLEET_SERVER, else "
TOKEN_HELP: Final = (
    "File holding the API bearer token (aggregator --api-token-file). Else env "
    "NICFLEET_TOKEN_FILE, else the current context's token-file, else none."
)
CONTEXT_HELP: Final = (
    "Use this context of the context file instead of its current-context "
    "(file: $NICFLEET_CONFIG or ~/.config/nicfleet/config.yaml)."
)


def given(ctx: click.Context | None = None) -> dict[str, str]:
    """The global options given so far in this invocation (parameter name -> value); the
    `meta` of `ctx` (default: the current context) is the whole invocation's."""
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return {}
    value = ctx.meta.setdefault(GIVEN_META_KEY, {})
    assert isinstance(value, dict)
    return value


def _remember(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if param.name == "server" and value is not None and not is_server_url(value):
        raise click.BadParameter(f"{value!r} is not an http:// or https:// URL", ctx, param)
    if value is not None and param.name is not None:
        given(ctx)[param.name] = value  # after the command beats before it: parsed later
    return value


def server_option(*, hidden: bool = False) -> click.Option:
    return click.Option(
        ["--server"],
        callback=_remember,
        expose_value=False,
        hidden=hidden,
        help=SERVER_HELP + f"the current context's server, else {DEFAULT_SERVER}.",
    )


def group_options() -> list[click.Option]:
    """The options of the `nicfleetctl` group itself, shown in its --help."""
    return [
        server_option(),
        click.Option(
            ["--token-file"],
            type=click.Path(dir_okay=False),
            callback=_remember,
            expose_value=False,
            help=TOKEN_HELP,
        ),
        click.Option(
            ["--context", "context_name"],
            metavar="NAME",
            callback=_remember,
            expose_value=False,
            help=CONTEXT_HELP,
        ),
        click.Option(
            ["-o", "--output"],
            metavar="FORMAT",
            callback=_remember,
            expose_value=False,
            help="Output format of the command (one of its own -o choices).",
        ),
    ]


def leaves(command: click.Command, ctx: click.Context | None = None) -> Iterator[click.Command]:
    """Every command that runs (not a group) under `command`."""
    if not isinstance(command, click.Group):
        yield command
        return
    ctx = ctx or click.Context(command)
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None:
            yield from leaves(sub, click.Context(sub, parent=ctx, info_name=name))


def add_global_options(command: click.Command, *, offline: bool) -> click.Command:
    """Accept the global options after `command` too (hidden in its --help: the group's
    lists them), and resolve the settings before it runs. `offline`: it needs no server,
    so a broken context file must not stop it."""
    own = {p.name for p in command.params}
    for option in group_options():
        if option.name not in own and option.name != "output":
            option.hidden = True
            command.params.append(option)
    callback = command.callback
    assert callback is not None

    @functools.wraps(callback)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        flags = given(ctx)
        if "output" in flags:
            kwargs = _with_output(ctx, command, flags["output"], kwargs)
        if offline:
            ctx.obj = flags.get("server") or DEFAULT_SERVER
        else:
            _resolve(ctx, flags)
        return callback(*args, **kwargs)

    command.callback = wrapped
    return command


def _with_output(
    ctx: click.Context, command: click.Command, value: str, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """`nicfleetctl -o json CMD`: the group's -o, unless CMD's own was given."""
    option = next((p for p in command.params if p.name == "output"), None)
    if option is None or "output" not in kwargs:
        raise click.UsageError(f"-o {value}: `{command.name}` has no output formats", ctx)
    if ctx.get_parameter_source("output") is not ParameterSource.DEFAULT:
        return kwargs
    return {**kwargs, "output": option.type.convert(value, option, ctx)}


def _resolve(ctx: click.Context, flags: dict[str, str]) -> None:
    settings = settings_from(
        server_flag=flags.get("server"),
        token_flag=flags.get("token_file"),
        context=flags.get("context_name"),
        environ=os.environ,
    )
    ctx.obj = settings.server
    ctx.meta[SETTINGS_META_KEY] = settings
    if settings.token_file is not None:
        source = settings.token_source or "--token-file"
        ctx.meta[TOKEN_META_KEY] = read_token_file(settings.token_file, source)
