"""A per-caller token bucket: ``rate`` requests a second on average, bursts of ``burst``.

One bucket per token (per client address for anonymous callers), kept in
the process: with several worker processes each enforces its own share.
A refused request is answered 429 ``rate_limited`` with ``Retry-After``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Final

__all__ = ["RateLimiter"]

_MAX_BUCKETS: Final = 10_000


class RateLimiter:
    """Token buckets by key; ``rate <= 0`` disables limiting."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> int:
        """Spend one request of ``key``'s bucket: 0 if allowed, else the seconds to wait."""
        if self.rate <= 0:
            return 0
        now = time.monotonic()
        with self._lock:
            tokens, stamp = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - stamp) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                self._prune(now)
                return 0
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / self.rate))

    def _prune(self, now: float) -> None:
        """Forget full buckets once there are many (a full bucket equals no bucket)."""
        if len(self._buckets) <= _MAX_BUCKETS:
            return
        refill = self.burst / self.rate
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < refill}
