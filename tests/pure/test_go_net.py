"""core/go/net.py: IPv4 addresses are printed without `ipaddress` (a one-shot ADD's import
cost); the result must be what the `ipaddress` path gives (which the Go oracle suite,
tests/tools/test_cni_gojson_oracle.py, holds to Go's net package)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from multicall.core.go.net import _ip_string, go_cidr, go_ip, parse_cidr, parse_ip

PART = st.one_of(
    st.integers(0, 300).map(str),
    st.sampled_from(["00", "01", "010", "256", "", "-1", "1e1", "٣", "0x1", " 1"]),
)
V4ISH = st.lists(PART, min_size=1, max_size=6).map(".".join)
MASK = st.one_of(
    st.integers(0, 40).map(str), st.sampled_from(["", "024", "-1", "33", "٣", "99999999"])
)


def slow_ip(text: str) -> str | None:
    ip = parse_ip(text)
    return None if ip is None else _ip_string(ip)


def slow_cidr(text: str) -> str | None:
    parsed = parse_cidr(text)
    return None if parsed is None else f"{_ip_string(parsed[0])}/{parsed[1]}"


@settings(max_examples=2000, derandomize=True, deadline=None)
@given(V4ISH)
def test_ipv4_text_is_printed_as_the_ipaddress_path_prints_it(text: str) -> None:
    assert go_ip(text) == slow_ip(text)


@settings(max_examples=2000, derandomize=True, deadline=None)
@given(V4ISH, st.sampled_from(["/", "", "//"]), MASK)
def test_ipv4_cidr_is_printed_as_the_ipaddress_path_prints_it(
    addr: str, slash: str, mask: str
) -> None:
    text = f"{addr}{slash}{mask}"
    assert go_cidr(text) == slow_cidr(text)


def test_examples() -> None:
    assert go_cidr("10.89.0.7/24") == "10.89.0.7/24"
    assert go_cidr("10.89.0.7/024") == "10.89.0.7/24"
    assert go_cidr("10.089.0.7/24") is None
    assert go_cidr("10.89.0.7/33") is None
    assert go_ip("192.168.0.1") == "192.168.0.1"
    assert go_ip("::ffff:192.168.0.1") == "192.168.0.1"
    assert go_cidr("fd00::1/64") == "fd00::1/64"
