"""The bounded client's retry policy (`BoundedSettings.retries`, none by default): a refused request is tried
again after its refusal's Retry-After, at most `retries` times and never past its budget (the objective's first
token, from its first arrival), then refused for good. Each try goes through the controller, against what is left
of that budget (`Controller.decide`'s `arrived`); an admitted retry is timed from the request's first arrival."""

from __future__ import annotations

import heapq


class Attempts:
    """A burst's tries in time order: each request's first at its scheduled offset, then the retries `again`
    adds while iterating (offsets in seconds after the release)."""

    def __init__(self, offsets: list[float], retries: int, budget_s: float = float("inf")):
        self.retries, self.budget_s, self._offsets = retries, budget_s, offsets
        self._due = [(offset, index, 0) for index, offset in enumerate(offsets)]  # already in order: a heap

    def __iter__(self):
        """(offset, index, attempt), the earliest first; retries added meanwhile are yielded in their turn."""
        while self._due:
            yield heapq.heappop(self._due)

    def again(self, index: int, attempt: int, at: float) -> bool:
        """Try the `attempt`-th refusal of request `index` again at offset `at`, if the policy allows and its budget
        is not spent by then."""
        if attempt >= self.retries:
            return False
        if at >= self._offsets[index] + self.budget_s:
            return False
        heapq.heappush(self._due, (at, index, attempt + 1))
        return True

    def final(self, reason: str, attempt: int) -> str:
        """The reason a request is refused for good, saying how many tries it had."""
        if not self.retries:
            return reason
        if attempt < self.retries:  # `again` stopped it: its budget would be spent
            return f"{reason}; refused on {attempt + 1} {'try' if not attempt else 'tries'}: a retry would come past " \
                   f"its budget"
        return f"{reason}; refused on all {attempt + 1} tries"
