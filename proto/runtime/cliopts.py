"""Click options the three commands share, defined once: logging and output format.

nicfleet-agent and nicfleet-aggregator take `--log-level/--log-format`; every command that
prints a result takes `-o/--output`, each with its own choices, default and help. Only the
flag surface lives here; what a command does with the values is its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from proto.runtime.logs import FORMATS, LEVELS

F = TypeVar("F", bound=Callable[..., object])


def log_options(*, level_default: str) -> Callable[[F], F]:
    """`--log-level` (NICFLEET_LOG_LEVEL; overrides -v) and `--log-format`
    (NICFLEET_LOG_FORMAT). `level_default` says in the help what applies without it."""
    level = click.option(
        "--log-level",
        type=click.Choice(LEVELS, case_sensitive=False),
        envvar="NICFLEET_LOG_LEVEL",
        help=f"Log level (overrides -v). Default: {level_default}.",
    )
    fmt = click.option(
        "--log-format",
        type=click.Choice(FORMATS),
        default="auto",
        show_default=True,
        envvar="NICFLEET_LOG_FORMAT",
        help="json: one JSON object per line; text; auto: text on a terminal, else JSON.",
    )

    def decorate(command: F) -> F:
        return level(fmt(command))

    return decorate


def output_option(*choices: str, help: str | None = None) -> Callable[[F], F]:
    """`-o/--output`: one of `choices`; the first is the default."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(choices),
        default=choices[0],
        show_default=True,
        help=help,
    )
