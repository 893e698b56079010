"""Retry schedule: exponential backoff with jitter, bounded attempts; pure and injectable for tests."""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait between attempts of one request."""

    max_attempts: int = 5  # including the first
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.5  # the delay is scaled by a uniform factor in [1 - jitter, 1 + jitter]

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("RetryPolicy backoff times must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")

    def delay(self, failed_attempt: int, rng: random.Random, hint_s: float | None = None) -> float:
        """Seconds to wait after attempt `failed_attempt` (1-based); a server hint (Retry-After) is a floor."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (failed_attempt - 1))
        d = base * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))
        if hint_s is not None and hint_s > d:
            d = hint_s
        return max(0.0, min(d, self.max_backoff_s))
