"""The bounded client's retry policy (`BoundedSettings.retries`, none by default): a refused request is tried
again after its refusal's Retry-After, at most `retries` times, then refused for good. Each try goes through
the controller afresh; an admitted retry is timed from the request's first arrival (its wait counts)."""

from __future__ import annotations

import heapq


class Attempts:
    """A burst's tries in time order: each request's first at its scheduled offset, then the retries `again`
    adds while iterating (offsets in seconds after the release)."""

    def __init__(self, offsets: list[float], retries: int):
        self.retries = retries
        self._due = [(offset, index, 0) for index, offset in enumerate(offsets)]  # already in order: a heap

    def __iter__(self):
        """(offset, index, attempt), the earliest first; retries added meanwhile are yielded in their turn."""
        while self._due:
            yield heapq.heappop(self._due)

    def again(self, index: int, attempt: int, at: float) -> bool:
        """Try the `attempt`-th refusal of request `index` again at offset `at`, if the policy allows."""
        if attempt >= self.retries:
            return False
        heapq.heappush(self._due, (at, index, attempt + 1))
        return True

    def final(self, reason: str, attempt: int) -> str:
        """The reason a request is refused for good, saying how many tries it had."""
        return reason if not self.retries else f"{reason}; refused on all {attempt + 1} tries"
