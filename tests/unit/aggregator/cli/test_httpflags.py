"""The --http-* flags: the connection bound's default from RLIMIT_NOFILE, the settings."""

from __future__ import annotations

import pytest

from aggregator.cli.httpflags import default_max_connections
from aggregator.cli.runsettings import RunFlags, aggregator_settings


@pytest.mark.parametrize(
    ("open_files", "bound"),
    [
        pytest.param(256, 96, id="256"),
        pytest.param(1024, 480, id="1024"),
        pytest.param(1_048_576, 1024, id="kubernetes-default-capped"),
        pytest.param(64, 16, id="tiny-floor"),
        pytest.param(-1, 1024, id="unlimited"),
    ],
)
def test_default_max_connections(open_files: int, bound: int) -> None:
    assert default_max_connections(open_files) == bound


def test_the_default_listen_address_stays_loopback() -> None:
    settings = aggregator_settings(RunFlags())
    assert settings.listen_host == "127.0.0.1"
    assert settings.http.header_timeout == 10.0
