"""nicfleetctl's console never ends a line with blanks (aggregator.ctl.render)."""

from __future__ import annotations

import io

import pytest
from rich.table import Table

from aggregator.ctl.render import TerminalBuffer, console_for, trim_lines


@pytest.mark.parametrize(
    ("text", "trimmed"),
    [
        pytest.param("a   \nb\n", "a\nb\n", id="plain"),
        pytest.param("\x1b[1mA  \x1b[0m   \n", "\x1b[1mA\x1b[0m\n", id="colour-kept"),
        pytest.param("a  b\n", "a  b\n", id="inner-blanks"),
        pytest.param("no newline  ", "no newline  ", id="partial-line"),
    ],
)
def test_trim_lines(text: str, trimmed: str) -> None:
    assert trim_lines(text) == trimmed


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "terminal"])
def test_a_padded_table_prints_without_trailing_blanks(tty: bool) -> None:
    stream: io.StringIO = TerminalBuffer(80) if tty else io.StringIO()
    table = Table(box=None, pad_edge=False)
    table.add_column("NAME")
    table.add_column("MESSAGE")
    table.add_row("x", "short")
    table.add_row("longer", "a much longer message")
    console_for(stream, {}).print(table)
    out = stream.getvalue()
    assert ("\x1b[" in out) == tty
    lines = out.splitlines()
    assert len(lines) == 3
    assert all(not line.endswith(" ") for line in trim_lines(out).splitlines())
    assert all(not line.replace("\x1b[0m", "").endswith(" ") for line in lines)


def test_a_link_without_cause_or_fix_never_prints_none() -> None:
    from aggregator.ctl.chain import _render_trace
    from proto.http import Link, Trace

    links = (
        Link(name="agent", status="ok"),
        Link(name="advertised", status="degraded", evidence={"healthy": 7}),
        Link(name="allocatable", status="broken"),
    )
    result = Trace(
        node="n1",
        resource="rdma/ib",
        checked_at=0.0,
        verdict="broken",
        ok=False,
        first_broken=2,
        links=links,
    )
    stream = io.StringIO()
    _render_trace(console_for(stream, {}), result, wide=False)
    out = stream.getvalue()
    assert "None" not in out
    assert out.count("cause: no cause given") == 2
    assert "fix:   no fix known: see the evidence" in out
