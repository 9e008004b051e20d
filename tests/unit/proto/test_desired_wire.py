"""DesiredUpdate on the wire: round trip with and without a config, the revision bound, and
a stored DesiredConfig never mistaken for an update (nor the other way round)."""

from __future__ import annotations

import pytest

from proto.codec import CodecError, decode, encode
from proto.messages.config import DesiredConfig, DesiredUpdate

STORED = encode(DesiredConfig(node="gpu-01", generation=3))


@pytest.mark.parametrize(
    "update",
    [
        pytest.param(DesiredUpdate(node="gpu-01", revision=7, config=STORED), id="config"),
        pytest.param(DesiredUpdate(node="gpu-01", revision=8), id="deleted"),
        pytest.param(DesiredUpdate(node="gpu-01"), id="never-written"),
    ],
)
def test_round_trip(update: DesiredUpdate) -> None:
    assert decode(encode(update), DesiredUpdate) == update


def test_the_stored_value_travels_byte_for_byte() -> None:
    update = decode(encode(DesiredUpdate(node="gpu-01", revision=1, config=STORED)), DesiredUpdate)
    assert update.config == STORED
    assert decode(update.config, DesiredConfig).generation == 3


def test_a_negative_revision_is_refused_by_path() -> None:
    with pytest.raises(CodecError) as caught:
        decode(encode(DesiredUpdate(node="gpu-01", revision=-1)), DesiredUpdate)
    assert caught.value.path == "$.revision"


def test_schemas_are_not_confused() -> None:
    with pytest.raises(CodecError):
        decode(STORED, DesiredUpdate)
    with pytest.raises(CodecError):
        decode(encode(DesiredUpdate(node="gpu-01", revision=1, config=STORED)), DesiredConfig)
