"""Shell completion for nicfleetctl: `nicfleetctl completion bash|zsh|fish` prints click's
script, and node-name arguments complete from the aggregator's node list.

A failed lookup (server down, token refused, bad context file) completes nothing; it
never prints an error into the user's shell.
"""

from __future__ import annotations

import os
from typing import Final

import click
from click.shell_completion import CompletionItem, get_completion_class

from aggregator.ctl.client import AggregatorClient, CtlError, read_token_file
from aggregator.ctl.config import CtlConfigError, settings_from
from aggregator.ctl.globalopts import given

SHELLS: Final = ("bash", "zsh", "fish")
COMPLETE_VAR: Final = "_NICFLEETCTL_COMPLETE"
LOOKUP_TIMEOUT: Final = 2.0
INSTALL: Final = """\b
Install (one of):
  bash:  echo 'eval "$(nicfleetctl completion bash)"' >> ~/.bashrc
  zsh:   echo 'eval "$(nicfleetctl completion zsh)"' >> ~/.zshrc
  fish:  nicfleetctl completion fish > ~/.config/fish/completions/nicfleetctl.fish"""


@click.command(epilog=INSTALL)
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, node names)."""
    root = click.get_current_context().find_root()
    cls = get_completion_class(shell)
    assert cls is not None  # every name in SHELLS is built into click
    command = root.command
    click.echo(cls(command, {}, root.info_name or "nicfleetctl", COMPLETE_VAR).source())


def complete_node_names(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Node names from GET /api/v1/nodes that start with `incomplete`."""
    flags = given(ctx)  # global options before and after the command, as parsed so far
    try:
        settings = settings_from(
            server_flag=flags.get("server"),
            token_flag=flags.get("token_file"),
            context=flags.get("context_name"),
            environ=os.environ,
        )
        token = read_token_file(settings.token_file) if settings.token_file else None
        with AggregatorClient(settings.server, timeout=LOOKUP_TIMEOUT, token=token) as client:
            names = client.node_names()
    except (CtlError, CtlConfigError):
        return []
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


def attach_node_completion(command: click.Command, *names: str) -> None:
    """Complete the parameters `names` of an existing command with node names."""
    for param in command.params:
        if param.name in names:
            param._custom_shell_complete = complete_node_names
