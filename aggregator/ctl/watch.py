"""Options added to existing nicfleetctl commands: `--watch [SECONDS]` and `-o yaml`.

`--watch` re-runs a list command: in place on a terminal (rich Live), one block per
interval otherwise; Ctrl-C ends it with exit 0. `-o yaml` runs the command's `-o json`
and prints the same document as YAML, so every command's YAML is exactly its JSON.
"""

from __future__ import annotations

import functools
import io
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout, suppress
from datetime import UTC, datetime
from typing import Any, Final

import click
import yaml
from rich.console import Group
from rich.live import Live
from rich.text import Text

from aggregator.ctl.client import ApiError, BadInput, CtlError, Unreachable
from aggregator.ctl.render import TerminalBuffer, console_for

DEFAULT_INTERVAL: Final = 2.0


def to_yaml(document: object) -> str:
    return yaml.safe_dump(document, sort_keys=True, allow_unicode=True, default_flow_style=False)


def add_yaml(command: click.Command) -> click.Command:
    """Add `yaml` to the command's `-o/--output` choices if they offer `json`."""
    option = next((p for p in command.params if p.name == "output"), None)
    if not isinstance(option, click.Option) or not isinstance(option.type, click.Choice):
        return command
    if "json" not in option.type.choices or "yaml" in option.type.choices:
        return command
    option.type = click.Choice([*option.type.choices, "yaml"])
    option.help = f"{option.help} yaml: the JSON as YAML."
    callback = command.callback
    assert callback is not None

    @functools.wraps(callback)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("output") != "yaml":
            return callback(*args, **kwargs)
        if kwargs.get("follow"):
            raise BadInput("-o yaml cannot stream; use -o json with --follow (one object a line)")
        buffer = io.StringIO()
        try:
            with redirect_stdout(buffer):
                return callback(*args, **{**kwargs, "output": "json"})
        finally:
            if buffer.getvalue().strip():
                click.echo(to_yaml(json.loads(buffer.getvalue())), nl=False)

    command.callback = wrapped
    return command


def add_watch(command: click.Command) -> click.Command:
    """Add `-w/--watch [SECONDS]` (and a hidden `--watch-count N` bound, for tests)."""
    command.params += [
        click.Option(
            ["-w", "--watch"],
            type=click.FloatRange(min=0.1),
            is_flag=False,
            flag_value=DEFAULT_INTERVAL,
            default=None,
            metavar="[SECONDS]",
            help=f"Re-run every SECONDS (default {DEFAULT_INTERVAL:g}) until Ctrl-C; "
            "redrawn in place on a terminal, a new block each time otherwise.",
        ),
        click.Option(["--watch-count"], type=click.IntRange(min=1), hidden=True),
    ]
    callback = command.callback
    assert callback is not None
    title = f"nicfleetctl {command.name}"

    @functools.wraps(callback)
    def wrapped(*args: Any, watch: float | None, watch_count: int | None, **kwargs: Any) -> Any:
        if watch is None:
            return callback(*args, **kwargs)
        if kwargs.get("follow"):
            raise BadInput("--watch cannot be combined with --follow")
        with suppress(KeyboardInterrupt):
            run_watch(lambda: callback(*args, **kwargs), watch, watch_count, title)
        return None

    command.callback = wrapped
    return command


def run_watch(tick: Callable[[], object], interval: float, count: int | None, title: str) -> None:
    """Run `tick` every `interval` seconds, `count` times (None: until Ctrl-C)."""
    header = functools.partial(_header, title, interval)
    runs = 0
    if sys.stdout.isatty():
        console = console_for(sys.stdout, os.environ)
        with Live(console=console, auto_refresh=False, redirect_stdout=False,
                  redirect_stderr=False) as live:  # fmt: skip
            while True:
                buffer = TerminalBuffer(console.width)
                with redirect_stdout(buffer), redirect_stderr(buffer):
                    error = _run_tick(tick)
                body = Text.from_ansi(buffer.getvalue().rstrip("\n"))
                parts = [Text(header(), style="bold"), Text(""), body]
                if error:
                    parts.append(Text(error, style="red"))
                live.update(Group(*parts), refresh=True)
                runs += 1
                if count is not None and runs >= count:
                    return
                time.sleep(interval)  # the user's interval, not a wait for a condition
    while True:
        click.echo(("\n" if runs else "") + header())
        error = _run_tick(tick)
        if error:
            click.echo(error, err=True)
        sys.stdout.flush()
        runs += 1
        if count is not None and runs >= count:
            return
        time.sleep(interval)


def _run_tick(tick: Callable[[], object]) -> str | None:
    """Run one refresh; a server that is down or failing is shown and retried, not fatal."""
    try:
        tick()
    except (Unreachable, ApiError) as exc:
        return f"Error: {exc.format_message()} (retrying)"
    except click.exceptions.Exit:
        pass
    except CtlError:
        raise
    return None


def _header(title: str, interval: float) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"Every {interval:g}s: {title}    {stamp}"
