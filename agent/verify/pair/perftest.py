"""Pure parsers of perftest's summary tables (`ib_write_bw`, `ib_send_lat`) and the
commands that produce them.

No I/O: agent.verify.pair.sides runs the tools and hands their stdout here. perftest reports MB/sec
as 2^20 bytes/s and Gb/sec as 10^9 bits/s; latency tests report round trip / 2 in µs.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from agent.errors import AgentError
from proto.messages.validation import LatencySummary

WRITE_BW: Final = "ib_write_bw"
SEND_LAT: Final = "ib_send_lat"
# perftest: format_factor 0x100000 for MB/sec, 125000000 (bytes in 10^9 bits) for Gb/sec.
_UNIT_BYTES: Final = {"MB/sec": float(1 << 20), "Gb/sec": 125_000_000.0}
_BW_HEADER: Final = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>MB/sec|Gb/sec)\]")
_LAT_HEADER: Final = re.compile(r"#bytes\s+#iterations\s+t_min\[usec\]")
_TWO_DECIMALS: Final = re.compile(r"\d+\.\d\d")


class PerftestParseError(AgentError, ValueError):
    """Output that holds no perftest result table (or a row that is not one)."""


class BandwidthRow(NamedTuple):
    message_size: int
    iterations: int
    peak: float  # in `unit`; 0.00 when perftest did not measure it
    average: float
    msg_rate_mpps: float
    unit: str  # MB/sec | Gb/sec

    @property
    def bytes_per_second(self) -> float:
        return self.average * _UNIT_BYTES[self.unit]


class LatencyRow(NamedTuple):
    message_size: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float  # perftest's median
    t_avg: float
    t_stdev: float
    p99: float
    p99_9: float

    def summary(self) -> LatencySummary:
        return LatencySummary(
            samples=self.iterations,
            p50_us=self.t_typical,
            p99_us=self.p99,
            min_us=self.t_min,
            max_us=self.t_max,
        )


def _table(text: str, header: re.Pattern[str], what: str) -> tuple[re.Match[str], list[str]]:
    lines = text.splitlines()
    for at, line in enumerate(lines):
        match = header.search(line)
        if match is None:
            continue
        rows = []
        for row in lines[at + 1 :]:
            if not row.strip() or row.lstrip().startswith("-"):
                break
            rows.append(row)
        if not rows:
            raise PerftestParseError(f"{what} table has a header but no rows")
        return match, rows
    raise PerftestParseError(f"no {what} result table in the output")


def _numbers(row: str, expected: int, what: str) -> list[str]:
    tokens: list[str] = []
    for token in row.split():
        # perftest prints fixed-width columns; a wide value can run into its neighbour
        # ("2465.901216.65"). Each of these columns has two decimals, so split there.
        tokens.extend(_TWO_DECIMALS.findall(token) if token.count(".") > 1 else [token])
    if len(tokens) != expected:
        raise PerftestParseError(f"{what} row {row.strip()!r} has {len(tokens)} columns, "
                                 f"expected {expected}")  # fmt: skip
    return tokens


def _int(token: str, row: str) -> int:
    if not token.isdigit():
        raise PerftestParseError(f"{token!r} in row {row.strip()!r} is not a count")
    return int(token)


def _float(token: str, row: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise PerftestParseError(f"{token!r} in row {row.strip()!r} is not a number") from None
    if value != value or value < 0 or value == float("inf"):
        raise PerftestParseError(f"{token!r} in row {row.strip()!r} is not a measurement")
    return value


def parse_bandwidth(text: str) -> list[BandwidthRow]:
    """Every row of a `*_bw` summary table (one per message size)."""
    header, rows = _table(text, _BW_HEADER, "bandwidth")
    parsed = []
    for row in rows:
        t = _numbers(row, 5, "bandwidth")
        parsed.append(
            BandwidthRow(
                message_size=_int(t[0], row),
                iterations=_int(t[1], row),
                peak=_float(t[2], row),
                average=_float(t[3], row),
                msg_rate_mpps=_float(t[4], row),
                unit=header.group("unit"),
            )
        )
    return parsed


def parse_latency(text: str) -> list[LatencyRow]:
    """Every row of a `*_lat` summary table run with iterations (not --duration)."""
    _, rows = _table(text, _LAT_HEADER, "latency")
    parsed = []
    for row in rows:
        t = _numbers(row, 9, "latency")
        values = [_float(v, row) for v in t[2:]]
        parsed.append(LatencyRow(_int(t[0], row), _int(t[1], row), *values))
    return parsed


def write_bw_command(
    *, device: str, gid_index: int | None, port: int, size: int, iterations: int,
    peer: str | None,
) -> list[str]:  # fmt: skip
    """`ib_write_bw` as server (peer None) or client; both sides need the same flags."""
    command = [WRITE_BW, "-d", device, "-p", str(port), "-s", str(size), "-n", str(iterations),
               "-F", "--report_gbits"]  # fmt: skip
    if gid_index is not None:
        command += ["-x", str(gid_index)]
    return command + ([peer] if peer else [])


def send_lat_command(
    *, device: str, gid_index: int | None, port: int, iterations: int, peer: str | None
) -> list[str]:
    command = [SEND_LAT, "-d", device, "-p", str(port), "-n", str(iterations), "-F"]
    if gid_index is not None:
        command += ["-x", str(gid_index)]
    return command + ([peer] if peer else [])
