"""`nicfleetctl config get-contexts|use-context|set-context`: show and edit the context
file (`config` reads, validates and writes it)."""

from __future__ import annotations

import os
from dataclasses import replace

import click

from aggregator.ctl.config import (
    DEFAULT_SERVER,
    Config,
    Context,
    CtlConfigError,
    config_path,
    is_server_url,
    load_config,
    save_config,
    with_context,
)


@click.group("config")
def config_group() -> None:
    """Show and edit the context file ($NICFLEET_CONFIG or ~/.config/nicfleet/config.yaml)."""


@config_group.command("get-contexts")
def get_contexts() -> None:
    """List the contexts; `*` marks the current one."""
    config = _load_for_edit()
    if not config.contexts:
        click.echo(f"No contexts in {config.path}.", err=True)
        return
    rows = [("CURRENT", "NAME", "SERVER", "TOKEN-FILE")] + [
        ("*" if c.name == config.current_context else "", c.name, c.server, c.token_file or "-")
        for c in config.contexts
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@config_group.command("use-context")
@click.argument("name")
def use_context(name: str) -> None:
    """Make NAME the current context."""
    config = _load_for_edit()
    if config.get(name) is None:
        have = ", ".join(c.name for c in config.contexts) or "none"
        raise CtlConfigError(f"{config.path}: no context named {name!r} (have: {have})")
    save_config(replace(config, current_context=name))
    click.echo(f'Switched to context "{name}".')


@config_group.command("set-context")
@click.argument("name")
@click.option("--server", help="Aggregator base URL (required for a new context).")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="File holding the API bearer token.",
)
@click.option("--use", is_flag=True, help="Also make it the current context.")
def set_context(name: str, server: str | None, token_file: str | None, use: bool) -> None:
    """Create or update context NAME (only the given fields change)."""
    config = _load_for_edit()
    old = config.get(name)
    if server is None and old is None:
        raise click.BadParameter("a new context needs --server", param_hint="'--server'")
    if server is not None and not is_server_url(server):
        raise click.BadParameter(
            f"{server!r} is not an http:// or https:// URL", param_hint="'--server'"
        )
    ctx = Context(
        name=name,
        server=server or (old.server if old else DEFAULT_SERVER),
        token_file=os.path.abspath(token_file) if token_file else (old.token_file if old else None),
    )
    updated = with_context(config, ctx)
    if use or updated.current_context is None:
        updated = replace(updated, current_context=name)
    save_config(updated)
    click.echo(f'Context "{name}" {"modified" if old else "created"} in {config.path}.')


def _load_for_edit() -> Config:
    path = config_path(os.environ)
    return load_config(path) or Config(path=path)
