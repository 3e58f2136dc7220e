"""The node agent's line per request (multicall/core/agent_log.py): fields, cuts, escaping in
both log formats, and the flood budget."""

from __future__ import annotations

import json

from multicall.core import logs
from multicall.core.agent_log import BURST, RATE, LineBudget, Outcome, cut, request_line

POD = {"ContainerID": "c0ffee", "Namespace": "default", "Pod": "web-1"}


def line(fmt: str, command: str, pod: dict[str, str], outcome: Outcome) -> str:
    level, message, fields = request_line(command, pod, outcome, 0.0123)
    return logs.format_line(fmt, "2026-01-01T00:00:00Z", level, message, fields)


def test_an_ok_add() -> None:
    assert line("plain", "ADD", POD, Outcome("ok")) == (
        'time="2026-01-01T00:00:00Z" level=info msg="ADD ok" ContainerID=c0ffee '
        "Namespace=default Pod=web-1 command=ADD duration_ms=12.3 result=ok\n"
    )


def test_a_cni_error_and_a_hand_back() -> None:
    error = line("plain", "DEL", POD, Outcome("error", cni_code="7"))
    assert 'level=warning msg="DEL failed with CNI error 7"' in error
    assert " cni_code=7 " in error
    assert " result=error" in error
    back = line("plain", "ADD", POD, Outcome("fallback", reason="other build"))
    assert 'level=info msg="ADD handed back to the caller"' in back
    assert ' reason="other build"' in back
    assert " result=fallback" in back


def test_the_message_names_only_known_commands() -> None:
    """The caller's CNI_COMMAND is a field (cut, quoted), never the message."""
    text = line("plain", "ADD\nlevel=error msg=forged" + "x" * 100, POD, Outcome("ok"))
    assert text.count("\n") == 1
    assert 'msg="other ok"' in text
    assert 'command="ADD\\nlevel=error msg=forged' in text
    assert "more)" in text


def test_caller_values_cannot_break_the_line_in_either_format() -> None:
    pod = {"ContainerID": "a\nb", "Namespace": "\x1b[2J\r", "Pod": "p" * 5000}
    for fmt in logs.FORMATS:
        text = line(fmt, "ADD", pod, Outcome("fallback", reason="r\nx"))
        assert text.count("\n") == 1, fmt
        assert text.endswith("\n"), fmt
        assert "\r" not in text, fmt
        assert "\x1b" not in text, fmt
        assert len(text) < 700, (fmt, len(text))
    document = json.loads(line("json", "ADD", pod, Outcome("ok")))
    assert document["ContainerID"] == "a\nb"
    assert document["Pod"] == cut("p" * 5000)


def test_cut() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("abcd", 3) == "abc...(1 more)"


def test_the_budget_allows_a_burst_then_the_rate() -> None:
    budget = LineBudget()
    taken = sum(budget.take(100.0) for _ in range(BURST + 50))
    assert taken == BURST
    assert budget.skipped == 50
    assert budget.said() == 50
    assert budget.skipped == 0
    # one second later: RATE more lines, and no more
    assert sum(budget.take(101.0) for _ in range(int(RATE) + 10)) == int(RATE)
    # a long quiet spell refills to BURST, not beyond
    assert sum(budget.take(10_000.0) for _ in range(BURST * 2)) == BURST


def test_the_budget_is_bounded_over_time() -> None:
    """A steady flood of 1,000 requests a second for 10 s writes about BURST + 10 * RATE."""
    budget = LineBudget()
    taken = sum(budget.take(i / 1000) for i in range(10_000))
    assert BURST + 9 * RATE <= taken <= BURST + 10 * RATE + 1
