"""perftest summary tables parsed from outputs of real runs (tests/data/perftest, each
file citing its source), and the bad output that must never become a number."""

from __future__ import annotations

import pytest

from agent.verify.pair.perftest import (
    PerftestParseError,
    parse_bandwidth,
    parse_latency,
    send_lat_command,
    write_bw_command,
)
from tests.support.paths import REPO

DATA = REPO / "tests" / "data" / "perftest"


def recorded(name: str) -> str:
    text = (DATA / name).read_text()
    assert text.startswith("# ")  # every recording names where it comes from
    return text


def test_write_bw_roce_gbits_post_list() -> None:
    (row,) = parse_bandwidth(recorded("write_bw_roce_gbits.txt"))
    assert (row.message_size, row.iterations, row.unit) == (8, 224958464, "Gb/sec")
    assert (row.peak, row.average, row.msg_rate_mpps) == (0.0, 0.48, 7.498617)
    assert row.bytes_per_second == pytest.approx(0.48e9 / 8)
    # perftest's own numbers agree: 8 B x 7.498617 Mpps is 0.48 Gb/s
    assert row.bytes_per_second == pytest.approx(8 * 7.498617e6, rel=0.01)


def test_write_bw_infiniband_size_sweep_keeps_every_row() -> None:
    rows = parse_bandwidth(recorded("write_bw_ib_sweep_gbits.txt"))
    assert [(r.message_size, r.average) for r in rows] == [(2, 0.042185), (4, 0.084457), (8, 0.17)]
    assert rows[-1].bytes_per_second == pytest.approx(0.17 * 125_000_000)


def test_bw_in_mbytes_is_mebibytes() -> None:
    (row,) = parse_bandwidth(recorded("send_bw_rxe_mbytes.txt"))
    assert (row.unit, row.peak, row.average) == ("MB/sec", 3.75, 3.06)
    assert row.bytes_per_second == pytest.approx(3.06 * 1048576)
    # 65536 B x 0.000049 Mpps = 3.21e6 B/s = 3.06 MiB/s: perftest's MB is 2^20
    assert row.bytes_per_second == pytest.approx(65536 * 49, rel=0.01)


def test_send_lat_client() -> None:
    (row,) = parse_latency(recorded("send_lat_rxe_client.txt"))
    assert (row.message_size, row.iterations) == (2, 1000)
    assert (row.t_min, row.t_max, row.t_typical, row.t_avg) == (461.98, 37858.01, 724.36, 927.05)
    assert (row.t_stdev, row.p99, row.p99_9) == (2486.36, 1084.09, 37858.01)
    summary = row.summary()
    assert (summary.samples, summary.p50_us, summary.p99_us) == (1000, 724.36, 1084.09)
    assert (summary.min_us, summary.max_us) == (461.98, 37858.01)


def test_send_lat_with_columns_run_together() -> None:
    # "2465.901216.65": t_stdev and the 99% percentile printed without a gap.
    (row,) = parse_latency(recorded("send_lat_rxe_server.txt"))
    assert (row.t_stdev, row.p99, row.p99_9) == (2465.90, 1216.65, 37330.73)
    assert row.t_typical == 692.41


def test_latency_over_infiniband_rdma_cm() -> None:
    (row,) = parse_latency(recorded("lat_ib_rdma_cm.txt"))
    assert row.summary().p50_us == 1.47 and row.p99 == 1.57


@pytest.mark.parametrize("name", ["send_lat_rxe_client.txt", "lat_ib_rdma_cm.txt"])
def test_latency_output_is_no_bandwidth(name: str) -> None:
    with pytest.raises(PerftestParseError, match="no bandwidth result table"):
        parse_bandwidth(recorded(name))


HEADER_BW = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
HEADER_LAT = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
              "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")  # fmt: skip


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("", "no bandwidth result table", id="empty"),
        pytest.param(" Couldn't connect to 10.0.0.5:18515\n", "no bandwidth", id="tool-failed"),
        pytest.param(HEADER_BW + "\n---\n", "header but no rows", id="header-only"),
        pytest.param(HEADER_BW + "\n 8 5000 0.17\n", "has 3 columns", id="short-row"),
        pytest.param(HEADER_BW + "\n 8 5000 0.17 fast 2.6\n", "'fast'", id="word"),
        pytest.param(HEADER_BW + "\n 8 5000 0.17 -0.17 2.6\n", "not a measurement", id="negative"),
        pytest.param(HEADER_BW + "\n 8 5000 0.17 nan 2.6\n", "not a measurement", id="nan"),
        pytest.param(HEADER_BW + "\n 8 5000 0.17 inf 2.6\n", "not a measurement", id="inf"),
        pytest.param(HEADER_BW + "\n 8.5 5000 0.17 0.17 2.6\n", "not a count", id="size-float"),
    ],
)
def test_bad_bandwidth_output_is_refused(text: str, needle: str) -> None:
    with pytest.raises(PerftestParseError, match=needle):
        parse_bandwidth(text)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param(HEADER_LAT + "\n 2 1000 1.42 1.93\n", "has 4 columns", id="short-row"),
        pytest.param(
            HEADER_LAT.replace("t_min", "t_avg") + "\n 2 1000 1.0\n", "no latency", id="duration"
        ),
        pytest.param(HEADER_LAT + "\n 2 1000 1.42.1.93 1 1 1 1 1 1\n", "columns", id="odd-glue"),
    ],
)
def test_bad_latency_output_is_refused(text: str, needle: str) -> None:
    with pytest.raises(PerftestParseError, match=needle):
        parse_latency(text)


def test_commands_server_and_client_differ_only_by_the_peer() -> None:
    server = write_bw_command(device="mlx5_0", gid_index=3, port=18515, size=65536,
                              iterations=5000, peer=None)  # fmt: skip
    client = write_bw_command(device="mlx5_0", gid_index=3, port=18515, size=65536,
                              iterations=5000, peer="10.0.0.5")  # fmt: skip
    assert client == [*server, "10.0.0.5"]
    assert server[:3] == ["ib_write_bw", "-d", "mlx5_0"] and "--report_gbits" in server
    assert server[server.index("-x") : server.index("-x") + 2] == ["-x", "3"]
    lat = send_lat_command(device="mlx5_1", gid_index=None, port=18516, iterations=1000, peer=None)
    assert lat == ["ib_send_lat", "-d", "mlx5_1", "-p", "18516", "-n", "1000", "-F"]
