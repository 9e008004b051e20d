"""proto.runtime.logs: one JSON object per line with the context fields, text on a terminal,
seeds masked, level and format flags on both CLIs (one module serves both processes)."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from click.testing import CliRunner

import proto.runtime.logs
from agent.cli import main as agent_main
from aggregator.cli.main import main as aggregator_main

SEED = "SUAM" + "A" * 54  # the shape of an NKey user seed (not a real one)
MODULES = [proto.runtime.logs]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    made = logging.LogRecord("nicfleet.test", logging.WARNING, __file__, 1, msg, args, info)
    made.__dict__.update(extra)
    return made


@pytest.mark.parametrize("logs", MODULES)
def test_json_is_one_object_per_line_with_the_context_fields(logs: ModuleType) -> None:
    line = logs.JsonFormatter().format(
        record("port %s/%d went %s", "mlx5_0", 1, "DOWN", node="n1", device="mlx5_0", port=1,
               rule="port-down", unrelated="x", exc=True)
    )  # fmt: skip
    assert "\n" not in line
    event = json.loads(line)
    assert event["msg"] == "port mlx5_0/1 went DOWN"
    assert event["level"] == "warning" and event["logger"] == "nicfleet.test"
    assert (event["node"], event["device"], event["port"], event["rule"]) == (
        "n1",
        "mlx5_0",
        1,
        "port-down",
    )
    assert "unrelated" not in event
    assert "ValueError: boom" in event["exc"]
    assert event["ts"].endswith("+00:00")


@pytest.mark.parametrize("logs", MODULES)
def test_text_appends_fields_before_a_traceback(logs: ModuleType) -> None:
    text = logs.TextFormatter().format(record("hello", node="n1", rule="r", exc=True))
    first, _, rest = text.partition("\n")
    assert first.endswith("WARNING nicfleet.test: hello node=n1 rule=r")
    assert "ValueError: boom" in rest


@pytest.mark.parametrize("logs", MODULES)
def test_a_seed_is_masked_in_both_formats(logs: ModuleType) -> None:
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        out = formatter.format(record("read %s", SEED))
        assert SEED not in out and "[seed redacted]" in out


@pytest.mark.parametrize("logs", MODULES)
def test_auto_is_text_on_a_terminal_and_json_otherwise(logs: ModuleType) -> None:
    assert logs.resolve_format("auto", Tty()) == "text"
    assert logs.resolve_format("auto", io.StringIO()) == "json"
    assert logs.resolve_format("json", Tty()) == "json"
    tty, pipe = Tty(), io.StringIO()
    logs.configure_logging("info", "auto", tty)
    logging.getLogger("x").info("to the terminal", extra={"node": "n1"})
    logs.configure_logging("debug", "auto", pipe)  # replaces the first handler
    logging.getLogger("x").debug("to a pipe", extra={"node": "n1"})
    assert "to the terminal node=n1" in tty.getvalue() and "to a pipe" not in tty.getvalue()
    assert json.loads(pipe.getvalue())["msg"] == "to a pipe"


@pytest.mark.parametrize(
    ("main", "args"),
    [(agent_main, ["--log-level", "loud", "lab", "--help"]),
     (aggregator_main, ["run", "--log-level", "loud"]),
     (aggregator_main, ["run", "--log-format", "xml"])],
)  # fmt: skip
def test_bad_log_flags_name_the_option(main: object, args: list[str]) -> None:
    result = CliRunner().invoke(main, args)  # type: ignore[arg-type]
    assert result.exit_code == 2
    assert "--log-" in result.output and "Traceback" not in result.output


def test_agent_log_flags_reach_the_root_logger() -> None:
    result = CliRunner().invoke(
        agent_main, ["--log-level", "DEBUG", "--log-format", "json", "lab", "--help"]
    )
    assert result.exit_code == 0, result.output
    assert logging.getLogger().level == logging.DEBUG


def test_the_agent_tags_every_event_with_its_node() -> None:
    out = io.StringIO()
    proto.runtime.logs.configure_logging("info", "json", out)
    proto.runtime.logs.tag_node("node-7")
    logging.getLogger("x").info("plain")
    logging.getLogger("x").info("elsewhere", extra={"node": "other"})
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["node"] for e in events] == ["node-7", "other"]
