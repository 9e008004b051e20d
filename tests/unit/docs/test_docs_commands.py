"""Every command shown in the docs is one the CLIs accept, and docs/cli-reference.md is what
docs/gen_cli_reference.py generates from them now.

Shell blocks (```sh, ```bash, ```shell; in ```console only `$ ` lines) of README.md and
docs/*.md are split into simple commands; each `nicfleetctl`, `nicfleet-agent`,
`nicfleet-aggregator` (also `python -m ...`) or `make` command must resolve with the real
click tree: every subcommand exists, every option is known, no extra arguments; `make`
targets exist. A block preceded by `<!-- needs-cluster -->` is skipped (see docs/cli.md).
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import click
import pytest

from agent.cli import main as agent_cli
from aggregator.cli.main import main as aggregator_cli
from aggregator.ctl.main import cli as ctl_cli
from tests.support.paths import REPO

ROOT = REPO
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
MARKER = "<!-- needs-cluster -->"
CLIS: dict[str, click.Command] = {
    "nicfleetctl": ctl_cli,
    "nicfleet-agent": agent_cli,
    "nicfleet-aggregator": aggregator_cli,
}
MODULES = {"agent": "nicfleet-agent", "aggregator": "nicfleet-aggregator",
           "aggregator.ctl": "nicfleetctl"}  # fmt: skip
SHELL_FENCES = {"sh", "bash", "shell", "console"}
PREFIXES = {"sudo", "env", "exec", "time", "command"}
_FENCE = re.compile(r"^(\s*)```\s*([\w-]*)")
_PLACEHOLDER = re.compile(r"<[A-Za-z][\w.:/-]*>")
_OPERATORS = {"|", "||", "&&", ";", "&", "(", ")"}


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    words: tuple[str, ...]  # the program (CLI name or "make") and its arguments


def shell_blocks(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number of the first command line, [command lines]) per runnable block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        indent, lang = match.groups()
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")),
            len(lines),
        )
        previous = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        if lang in SHELL_FENCES and previous != MARKER:
            body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
            yield i + 2, _commands(body, console=lang == "console")
        i = end + 1


def _commands(body: list[str], *, console: bool) -> list[str]:
    """Command lines of a block: prompts stripped, continuations joined, heredocs skipped."""
    out: list[str] = []
    pending = ""
    heredoc: str | None = None
    for raw in body:
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        elif console:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        if doc := re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line):
            heredoc = doc.group(1)
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
    return out


def doc_commands() -> Iterator[DocCommand]:
    for path in DOCS:
        for first, lines in shell_blocks(path):
            for offset, line in enumerate(lines):
                where = f"{path.relative_to(ROOT)}:{first + offset}"
                for words in _simple_commands(line):
                    if command := _ours(words):
                        yield DocCommand(where, command)


def _simple_commands(line: str) -> Iterator[list[str]]:
    lexer = shlex.shlex(_PLACEHOLDER.sub("PLACEHOLDER", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    redirect = False
    for token in lexer:
        if token in _OPERATORS:
            yield words
            words, redirect = [], False
        elif set(token) <= set("<>&") or redirect:
            redirect = True  # a redirection: the rest is not arguments
        elif token not in ("...", "…"):
            words.append(token)
    yield words


def _ours(words: list[str]) -> tuple[str, ...] | None:
    while words and (words[0] in PREFIXES or re.fullmatch(r"[A-Za-z_]\w*=.*", words[0])):
        words = words[1:]
    if "--" in words and words.index("--") + 1 < len(words):  # kubectl exec ... -- CMD
        inner = _ours(words[words.index("--") + 1 :])
        if inner:
            return inner
    if not words:
        return None
    program = Path(words[0]).name
    if re.fullmatch(r"python3?(\.\d+)?", program) and words[1:2] == ["-m"] and len(words) > 2:
        program, words = MODULES.get(words[2], ""), words[2:]
    if program in CLIS or program == "make":
        if re.search(r"\.(py)$", words[0]):
            return None
        return (program, *words[1:])
    return None


def check_cli(command: click.Command, prog: str, args: list[str]) -> None:
    """Parse `args` with the real click parsers (options known and given their values,
    subcommands exist, positional arguments neither missing nor extra), without converting
    values or running callbacks: placeholders and paths of a doc need not exist here."""
    ctx = click.Context(command, info_name=prog, **command.context_settings)
    path = [prog]
    while True:
        given, positional, _ = ctx.command.make_parser(ctx).parse_args(list(args))
        if not isinstance(ctx.command, click.Group):
            break
        if not positional:
            return
        name, sub, args = ctx.command.resolve_command(ctx, positional)
        assert name is not None and sub is not None  # unknown commands raise UsageError
        path.append(name)
        ctx = click.Context(sub, info_name=name, parent=ctx, **sub.context_settings)
    # Arguments are parsed into `given` (click's parser knows them); leftovers are extra.
    if positional and not ctx.allow_extra_args:
        raise click.UsageError(f"unexpected extra arguments {positional} for {' '.join(path)}")
    for argument in ctx.command.params:
        if isinstance(argument, click.Argument) and argument.required:
            value = given.get(argument.name or "")
            if value is None or value == () or value is click.core.UNSET:  # type: ignore[attr-defined]
                raise click.UsageError(f"{' '.join(path)} needs {argument.human_readable_name}")


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([\w./-]+)\s*:(?!=)", text, flags=re.MULTILINE))


COMMANDS = list(doc_commands())


def test_the_docs_show_commands() -> None:
    programs = {c.words[0] for c in COMMANDS}
    assert programs >= {"nicfleetctl", "nicfleet-agent", "nicfleet-aggregator", "make"}


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_documented_command_is_accepted(command: DocCommand) -> None:
    program, *args = command.words
    if program == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        missing = set(targets) - make_targets()
        assert not missing, f"{command.where}: no make target {sorted(missing)}"
        return
    try:
        check_cli(CLIS[program], program, args)
    except click.ClickException as exc:
        pytest.fail(
            f"{command.where}: `{shlex.join(command.words)}` is not accepted: "
            f"{exc.format_message()} (fix the doc, or mark the block {MARKER})"
        )


def test_the_parser_of_this_test_catches_mistakes() -> None:
    with pytest.raises(click.UsageError, match="No such command 'nodez'"):
        check_cli(ctl_cli, "nicfleetctl", ["nodez"])
    with pytest.raises(click.NoSuchOption):
        check_cli(ctl_cli, "nicfleetctl", ["nodes", "--sate", "ready"])
    with pytest.raises(click.UsageError, match="extra arguments"):
        check_cli(ctl_cli, "nicfleetctl", ["nodes", "gpu-1"])
    with pytest.raises(click.UsageError, match="needs NAME"):
        check_cli(ctl_cli, "nicfleetctl", ["node"])
    with pytest.raises(click.BadOptionUsage):
        check_cli(ctl_cli, "nicfleetctl", ["node", "x", "-o"])
    check_cli(ctl_cli, "nicfleetctl", ["--server", "http://x:1", "node", "NAME", "-o", "wide"])
    lines = _commands(["$ NICFLEET_SERVER=http://a nicfleetctl \\", "  nodes | head", "out"],
                      console=True)  # fmt: skip
    assert [_ours(w) for w in _simple_commands(lines[0])] == [("nicfleetctl", "nodes"), None]
    assert _ours(["kubectl", "exec", "ds/a", "--", "nicfleet-agent", "snapshot"]) == (
        "nicfleet-agent", "snapshot",
    )  # fmt: skip
    assert _ours([".venv/bin/python", "-m", "aggregator.ctl", "nodes"]) == ("nicfleetctl", "nodes")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", ROOT / "docs/gen_cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_generated_from_the_clis() -> None:
    generator = _generator()
    expected = generator.render()
    current = (ROOT / "docs/cli-reference.md").read_text(encoding="utf-8")
    assert current == expected, (
        "docs/cli-reference.md is out of date with the CLIs: regenerate it with "
        "`make docs-cli` (or `.venv/bin/python docs/gen_cli_reference.py`) and commit it"
    )
