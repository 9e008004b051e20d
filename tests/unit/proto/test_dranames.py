"""DRA device names: DNS labels, reversible, with and without share copies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proto.dranames import InvalidDeviceName, device_name, rdma_device_of


@pytest.mark.parametrize(
    ("rdma", "share", "name"),
    [
        ("mlx5_0", None, "mlx5-0"),
        ("mlx5_bond_0", None, "mlx5-bond-0"),
        ("mlx5_12", 3, "mlx5-12-s3"),
        ("rxe0", None, "rxe0"),
    ],
)
def test_names(rdma: str, share: int | None, name: str) -> None:
    assert device_name(rdma, share) == name
    assert rdma_device_of(name) == (rdma, share)


@pytest.mark.parametrize(
    ("rdma", "share"),
    [
        ("mlx5-0", None),
        ("MLX5_0", None),
        ("mlx5_0_", None),
        ("mlx5_0", -1),
        ("m" * 64, None),
        ("rxe_s0", None),
    ],
)
def test_refused(rdma: str, share: int | None) -> None:
    with pytest.raises(InvalidDeviceName):
        device_name(rdma, share)


@pytest.mark.parametrize("name", ["", "Mlx5-0", "mlx5_0", "-mlx5", "x" * 64])
def test_reverse_refuses_non_labels(name: str) -> None:
    with pytest.raises(InvalidDeviceName):
        rdma_device_of(name)


@given(
    st.from_regex(r"[a-z][a-z0-9]{0,8}(_[a-z][a-z0-9]{0,5})?_[0-9]{1,3}", fullmatch=True),
    st.one_of(st.none(), st.integers(min_value=0, max_value=512)),
)
def test_round_trip(rdma: str, share: int | None) -> None:
    assert rdma_device_of(device_name(rdma, share)) == (rdma, share)
