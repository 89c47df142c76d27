"""The admission controller's settings: one typed, frozen home for each (parity.settings.Settings)."""

from __future__ import annotations

from dataclasses import dataclass
from math import inf
from statistics import NormalDist

from parity.errors import ParityError
from parity.settings import Settings


@dataclass(frozen=True)
class BoundedSettings(Settings):
    """How bounded admission decides (parity.admission). Off unless an arm names it (the sustained experiment's
    `bounded`). Not the `admission` experiment's settings (the Flame batch screening)."""

    what = "admission setting"
    recorded_when_set = ("orphan_demand",)  # the bounded arm's trials from before it stay current
    headroom: float = 1.0  # a prediction must fit this share of the objective's TTFT (the quantile is the margin)
    quantile: float = 0.99  # judge a request by the wait its first token stays within this often, under the error
    # its shard has shown (parity.admission.rate); 0: by the fitted line alone
    seed_tokens_per_s: float = 16000.0  # a shard's rate before it has finished anything: about a third of the
    # calibrated H200's prefill (config/sim), so an unlearned shard refuses early rather than misses
    alpha: float = 0.05  # the weight of each new first token's (work ahead, wait) in the shard's fit (older fade)
    reroute: bool = False  # a shard that cannot meet the objective passes the request to one that can
    retries: int = 0  # the client's policy: tries a refused request gets again, each after its Retry-After
    cold_sd_s: float = 0.0  # a cold-start prior (issue 30's 1.6x miss; off by default): until a shard has seen
    # 1 / alpha first tokens, the margin's spread is this many seconds, not its own few errors' (infinite until two);
    # from the calibrated engine: where in a full prefill step a first token lands, step / sqrt(12)
    queue_s: float = 0.0  # the deadline-aware queue (issue 30; off by default): a request that would be refused is held
    # up to this long (at most the budget), judged again in arrival order as first tokens release booked prefill,
    # admitted when its predicted wait fits the budget less its hold, refused at its bound

    orphan_s: float = 0.0  # refuse orphans (issue 30's 1.6x miss; off by default): for this long after a document's
    # uncached question was refused, a later question of it that would also come uncached is refused too, even where
    # it would fit (admitting it alone prefills the document for one question, not the several a first one seeds)
    orphan_grace: int = 0  # with orphan_s (off by default): this many of a refused document's next uncached questions
    # are judged as any request (each may still seed it, for the questions after it) before the rest are orphans
    orphan_demand: int = 0  # with orphan_s (off by default): a refused document asked this many times since its first
    # refusal (orphans counted) is hot, and its questions are judged as any request again: one seed then serves the
    # many after it (a Zipf document's first refusal made orphans of most of hot-640; benchmarks/admission_bound.py)

    @property
    def z(self) -> float:
        """The quantile's standard normal score (0 for none: the errors' mean alone)."""
        return NormalDist().inv_cdf(self.quantile) if self.quantile else 0.0

    def check(self):
        # the bounds (the schema's too): past them the fit's sums overflowed or divided by 0 once trials had run
        # (outsiders': seed_tokens_per_s 1e-300, then headroom 1e308 or 1e-308, alpha 1e-308, cold_sd_s 1e160)
        if not 1e-3 <= self.headroom <= 1e3:
            raise ParityError(f"admission setting headroom must be in [0.001, 1000], got {self.headroom!r}")
        if not 1 <= self.seed_tokens_per_s <= 1e9:
            raise ParityError(f"admission setting seed_tokens_per_s must be 1 to 1e9 tokens a second, "
                              f"got {self.seed_tokens_per_s!r}")
        if not 0 <= self.cold_sd_s <= 3600:
            raise ParityError(f"admission setting cold_sd_s must be 0 to 3600 seconds, got {self.cold_sd_s!r}")
        if not 0 <= self.orphan_s < inf:
            raise ParityError(f"admission setting orphan_s must be 0 or more seconds, got {self.orphan_s!r}")
        if self.orphan_grace < 0:  # its type is checked with every field's (Settings)
            raise ParityError(f"admission setting orphan_grace must be a whole number 0 or more, "
                              f"got {self.orphan_grace!r}")
        if self.orphan_grace and not self.orphan_s:
            raise ParityError("admission setting orphan_grace says how many orphans are judged as any request: it "
                              "needs orphan_s")
        if self.orphan_demand < 0:
            raise ParityError(f"admission setting orphan_demand must be a whole number 0 or more, "
                              f"got {self.orphan_demand!r}")
        if self.orphan_demand and not self.orphan_s:
            raise ParityError("admission setting orphan_demand says when a refused document's orphans are judged "
                              "again: it needs orphan_s")
        if not 0 <= self.queue_s < inf:
            raise ParityError(f"admission setting queue_s must be 0 or more seconds, got {self.queue_s!r}")
        if self.queue_s and self.retries:
            raise ParityError("admission settings queue_s and retries are two ways to try a refused request again: "
                              "set one")
        if self.retries < 0:
            raise ParityError(f"admission setting retries must be 0 or more, got {self.retries!r}")
        if not (self.quantile == 0 or 0.5 <= self.quantile < 1):
            raise ParityError(f"admission setting quantile must be 0 or in [0.5, 1), got {self.quantile!r}")
        if not 1e-6 <= self.alpha <= 1:
            raise ParityError(f"admission setting alpha must be in [1e-6, 1], got {self.alpha!r}")
