"""core/backoff.py: client-go's reflector back-off, kubert's retry at once after progress."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicall.core.backoff import CAP, INITIAL, RESET_AFTER, Backoff


def test_client_go_numbers_doubling_to_the_cap() -> None:
    backoff = Backoff()
    waits = [backoff.failed(float(t), 0.0) for t in range(9)]
    assert waits == [0.0, INITIAL, 1.6, 3.2, 6.4, 12.8, 25.6, CAP, CAP]
    assert (INITIAL, CAP, RESET_AFTER) == (0.8, 30.0, 120.0)


def test_jitter_reaches_twice_the_base() -> None:
    backoff = Backoff()
    backoff.failed(0.0, 0.0)
    assert backoff.failed(1.0, 0.999) == pytest.approx(0.8 * 1.999)


def test_progress_retries_at_once_then_backs_off_again() -> None:
    backoff = Backoff(initial=0.2)
    for t in range(4):
        backoff.failed(float(t), 0.0)
    backoff.progressed()
    assert backoff.failed(10.0, 0.0) == 0.0
    assert backoff.failed(11.0, 0.0) > 0.2  # the base is kept: only a quiet spell resets it


def test_the_base_resets_after_two_quiet_minutes() -> None:
    backoff = Backoff()
    for t in range(6):
        backoff.failed(float(t), 0.0)
    assert backoff.failed(6.0 + RESET_AFTER + 1, 0.0) == INITIAL


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 1, exclude_max=True)), max_size=60))
def test_a_loop_without_progress_never_waits_less_than_before(
    steps: list[tuple[bool, float]],
) -> None:
    """Failures only (rule 2): after the first, every wait is at least the base before it,
    within the cap, whatever the jitter; so such a loop makes a bounded number of attempts."""
    backoff = Backoff()
    now = 0.0
    bases: list[float] = []
    for _, draw in steps:
        wait = backoff.failed(now, draw)
        now += wait
        if bases or wait:
            bases.append(round(wait / (1 + draw), 9))
    assert all(b <= CAP for b in bases)
    assert bases == sorted(bases)
