"""Retry schedule: exponential backoff with jitter, bounded attempts; pure and injectable for tests.

The defaults ride out a minute of quota errors (429): with every delay at the bottom of its jitter band the
backoffs before the last attempt add up to 91.5 s (0.5 + 1 + 2 + 4 + 8 + 16 + 30 + 30), at the top to 214.5 s.
"""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait between attempts of one request."""

    max_attempts: int = 9  # including the first
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0  # also the longest server hint (Retry-After) honoured
    multiplier: float = 2.0
    jitter: float = 0.5  # the delay is scaled by a uniform factor in [1 - jitter, 1 + jitter]

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("RetryPolicy backoff times must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter}")

    def base_delay(self, failed_attempt: int) -> float:
        """The un-jittered wait after attempt `failed_attempt` (1-based), capped at max_backoff_s."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (failed_attempt - 1))

    def delay(self, failed_attempt: int, rng: random.Random, hint_s: float | None = None) -> float:
        """Seconds to wait after attempt `failed_attempt` (1-based); a server hint (Retry-After) is a floor."""
        d = self.base_delay(failed_attempt) * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))
        if hint_s is not None and hint_s > d:
            d = hint_s
        return max(0.0, min(d, self.max_backoff_s))

    def min_total_backoff_s(self) -> float:
        """The shortest time a request keeps trying (every delay at its lowest jitter, no hints): the window a
        quota burst must fit in before the request fails."""
        return sum(self.base_delay(k) * (1.0 - self.jitter) for k in range(1, self.max_attempts))

    def max_total_backoff_s(self) -> float:
        """The longest total backoff before the last attempt (every delay at its highest jitter, capped)."""
        return sum(min(self.max_backoff_s, self.base_delay(k) * (1.0 + self.jitter))
                   for k in range(1, self.max_attempts))
