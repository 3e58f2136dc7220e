"""Every number an applet's flags carry, read as the program it follows reads it, whatever
its length (issue 29: a 5,000-digit `--admin-addr` port reached CPython's 4,300-digit limit
and the user saw `internal error: ValueError: Exceeds the limit ...`), or refused with a
clear message; no case shows a Python internal (tests/support/plain.py). Refusals run
through the dispatcher's boundary; values that would be accepted are checked on the
parsing function itself, so nothing here starts a service.
"""

from __future__ import annotations

import io
import subprocess

import pytest

from multicall.applets import APPLETS, find_applet
from multicall.applets.linkerd_cni_agent import _float, _int
from multicall.applets.linkerd_cni_agent import parse_args as agent_args
from multicall.core.repair.cli import parse_args as repair_args
from multicall.core.repair.cli import parse_duration
from multicall.dispatch import run_applet
from multicall.effects.admin_server import parse_address
from multicall.errors import UsageError
from tests.support.cnibox import cnibox_argv
from tests.support.plain import assert_plain

ENV = {
    "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME": "n",
    "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME": "p",
}
LONG_ZEROS = "0" * 5000
LONG_NINES = "9" * 5000

ADDRESSES_OK = [
    ("127.0.0.1:9990", ("127.0.0.1", 9990)),
    ("0.0.0.0:0", ("0.0.0.0", 0)),
    ("[::1]:80", ("::1", 80)),
    (f"127.0.0.1:{LONG_ZEROS}80", ("127.0.0.1", 80)),  # Rust's read_number: zeros are free
    ("127.0.0.1:065535", ("127.0.0.1", 65535)),
]
ADDRESSES_BAD = [
    f"127.0.0.1:{LONG_NINES}",
    f"127.0.0.1:{LONG_ZEROS}65536",
    "127.0.0.1:65536",
    "127.0.0.1:\u0661\u0662",  # Arabic-Indic digits: str.isdigit() and int() took them
    "127.0.0.1:+80",
    "127.0.0.1:-1",
    "127.0.0.1: 80",
    "127.0.0.1:8_0",
    "127.0.0.1:",
    ":80",
    "localhost:80",
    "::1:80",
    "1\x00.0.0.1:80",  # inet_pton's ValueError (embedded null) was not caught
    "\udcff:80",  # a byte that is not UTF-8 in argv (surrogateescape)
    "[::1:80",
    f"{'1.' * 3000}1:80",
]


@pytest.mark.parametrize(("text", "expected"), ADDRESSES_OK, ids=lambda v: str(v)[:30])
def test_admin_addresses_read(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ADDRESSES_BAD, ids=lambda v: repr(v)[:30])
def test_admin_addresses_refused(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_address(text)
    assert "invalid socket address syntax" in caught.value.message
    assert len(caught.value.message) < 400
    assert_plain(caught.value.message)


INTS_OK = [("4", 4), (f"{LONG_ZEROS}4", 4), ("+4", 4), ("0004", 4)]
INTS_BAD = [LONG_NINES, LONG_ZEROS, "0", "-1", "", "+", " 4", "4 ", "4_0", "\u0664", "0x4", "4.0"]
FLOATS_OK = [("25", 25.0), ("0.5", 0.5), (".5", 0.5), (f"{LONG_ZEROS}2", 2.0)]
FLOATS_BAD = ["inf", "nan", "1e400", "1e3", "1_0", "-1", "0", "", " 1", "\u0661", LONG_NINES + "x"]


@pytest.mark.parametrize(("text", "value"), INTS_OK, ids=lambda v: str(v)[:20])
def test_agent_integers_as_go_atoi(text: str, value: int) -> None:
    assert _int({"workers": text}, "workers", 1) == value


@pytest.mark.parametrize(("text", "value"), FLOATS_OK, ids=lambda v: str(v)[:20])
def test_agent_seconds(text: str, value: float) -> None:
    assert _float({"request-timeout": text}, "request-timeout") == value


AGENT_REFUSALS = [
    *(("--workers", v) for v in INTS_BAD),
    *(("--max-workers", v) for v in INTS_BAD if v),  # empty: the default
    *(("--worker-requests", v) for v in INTS_BAD[:4]),
    *(("--max-requests", v) for v in INTS_BAD[:4]),
    *((f"--{flag}", v) for flag in ("request-timeout", "shutdown-grace") for v in FLOATS_BAD),
    *(("--admin-addr", v) for v in ADDRESSES_BAD),
]


@pytest.mark.parametrize(("flag", "value"), AGENT_REFUSALS, ids=lambda v: repr(v)[:24])
def test_agent_flags_refused_before_anything_starts(flag: str, value: str) -> None:
    """The agent's command-line reader refuses them (the dispatcher prints the UsageError
    and exits 2), so a bad value never reaches the keeper's start or the preload (a bad
    --admin-addr used to be seen only at bind, after the keeper had started). The parser
    is called directly: a value accepted by mistake must not start an agent here."""
    with pytest.raises(UsageError) as caught:
        agent_args([f"{flag}={value}"])
    assert flag in caught.value.message
    assert len(caught.value.message) < 400
    assert_plain(caught.value.message)


DURATIONS_OK = [("9s", 9.0), ("1m30s", 90.0), ("250ms", 0.25), (f"{LONG_ZEROS}5s", 5.0)]
DURATIONS_BAD = [
    f"{LONG_NINES}s",
    LONG_NINES,
    "\u0661s",  # `\d` took any script's digits
    "1_0s",
    "-1s",
    "1e3s",
    "s",
    "",
    "9 s",
    "inf",
]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS_OK, ids=lambda v: str(v)[:20])
def test_repair_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", DURATIONS_BAD, ids=lambda v: repr(v)[:20])
def test_repair_durations_refused(text: str) -> None:
    """Clap's `invalid value` line; a value Go's time.Duration cannot hold is invalid (it
    was an infinite timeout)."""
    with pytest.raises(UsageError) as caught:
        repair_args([f"--watch-timeout={text}"], ENV)
    assert caught.value.message.startswith("error: invalid value")
    assert_plain(caught.value.message)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("linkerd-cni-repair-controller", [f"--kube-api-response-headers-timeout={LONG_NINES}s"]),
        ("linkerd-cni-repair-controller", ["--error-delay=\u0665s"]),
        ("iptables-verify", ["--config=/nonexistent", f"--pid={LONG_NINES}"]),
        ("iptables-verify", ["--config=/nonexistent", "--pid=\u0661"]),
        ("iptables-verify", ["--config=/nonexistent", "--pid=0"]),
        ("iptables-verify", ["--config=/nonexistent", f"--pid={LONG_ZEROS}"]),
        ("iptables-verify", ["--config=/nonexistent", "--pid=-1"]),
        ("iptables-verify", ["--config=/nonexistent", "--pid=4194304"]),
        ("netns-exec", [f"--target={LONG_NINES}", "true"]),
        ("netns-exec", [f"--net=/proc/{LONG_NINES}/ns/net", "true"]),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_other_applets_numbers_refused_plainly(name: str, args: list[str]) -> None:
    """A separate process each (netns-exec would exec if a value were taken by mistake)."""
    proc = subprocess.run(
        [*cnibox_argv(name), *args],
        capture_output=True,
        timeout=30,
        env={"PATH": "/nonexistent", **ENV},
        check=False,
    )
    text = (proc.stdout + proc.stderr).decode("utf-8", "replace")
    assert proc.returncode not in (0, 70), text
    assert_plain(text)


@pytest.mark.parametrize("name", sorted(a.name for a in APPLETS), ids=str)
@pytest.mark.parametrize(
    "args",
    [["--" + "x" * 5000], ["--\udcff"], ["-\udcff"], ["--" + "9" * 5000 + "=1"]],
    ids=["long-option", "surrogate-option", "surrogate-short", "digits-option"],
)
def test_every_applet_refuses_hostile_options_plainly(name: str, args: list[str]) -> None:
    """Every row of the applet table, through the dispatcher's boundary in this process:
    an option no applet has (5,000 characters, an argv byte that is not UTF-8) stops at
    the command line with a usage error, never an internal error (nothing else runs)."""
    applet = find_applet(name)
    assert applet is not None
    out, err = io.BytesIO(), io.BytesIO()
    status = run_applet(applet, [name, *args], {"PATH": "/nonexistent"}, (io.BytesIO(), out, err))
    text = (out.getvalue() + err.getvalue()).decode("utf-8", "replace")
    assert status not in (0, 70), text
    assert_plain(text)
