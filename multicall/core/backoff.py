"""Back-off for loops that can end at once (a watch, a list, a reconnect): client-go's
reflector numbers with kubert's retry at once after progress.

Rules of this module:
1. The delays are client-go's `wait.NewExponentialBackoffManager(800ms, 30s, 2min, 2.0,
   1.0)` as its reflector sets it up: a base delay that doubles up to a cap, each wait
   jittered from the base to twice it (a thousand nodes do not reconnect in step), and the
   base back to the first one when no wait started for `reset_after` seconds.
2. The caller says what happened after each attempt: `progressed()` (it made progress: the
   caller defines it and says so in its docs) resets the streak, so the next failure is
   retried at once, as kubert does; `failed(now, draw)` returns how long to wait, the
   first failure after progress 0 s and each later one the next jittered delay. A loop
   that never makes progress therefore waits ever longer, whatever else it receives.
3. Pure: the clock (`now`, monotonic seconds) and the jitter (`draw`, uniform in [0, 1))
   are the caller's, so tests need neither sleeping nor patching.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# client-go tools/cache/reflector.go: NewExponentialBackoffManager(800*time.Millisecond,
# 30*time.Second, 2*time.Minute, 2.0, 1.0, clock)
INITIAL = 0.8
CAP = 30.0
RESET_AFTER = 120.0
FACTOR = 2.0
JITTER = 1.0


@dataclass(slots=True)
class Backoff:
    """One loop's back-off state: the streak of failures since its last progress and the
    current base delay (rules 1-2)."""

    initial: float = INITIAL
    cap: float = CAP
    reset_after: float = RESET_AFTER
    factor: float = FACTOR
    jitter: float = JITTER
    streak: int = 0  # failures since the last progress
    _base: float = field(default=0.0, repr=False)
    _last_wait: float | None = field(default=None, repr=False)

    def progressed(self) -> None:
        """Rule 2: progress ends the streak (the next failure is retried at once)."""
        self.streak = 0

    def failed(self, now: float, draw: float) -> float:
        """Seconds to wait after a failed (or unproductive) attempt at `now`."""
        self.streak += 1
        if self.streak == 1:
            return 0.0
        if self._last_wait is None or now - self._last_wait > self.reset_after:
            self._base = self.initial
        self._last_wait = now
        delay = self._base
        self._base = min(self._base * self.factor, self.cap)
        return delay + draw * self.jitter * delay
