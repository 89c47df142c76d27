"""The prefix-aware router (placement `prefix`): a policy of our own beside the study's (`sticky`,
`parity.routing.sticky`), which stays as the study ran it and the default of the study's tables.

- Identity: the chain of hashes over every full block of the whole prompt (`block_tokens` each),
  salted with the model revision, so a shared head of any length is matched as far as it goes
  (`parity.routing.hashing`, which the engines' KV cache events are read back into).
- Matching: per shard, the deepest block of the chain it holds; an index maps each block to the
  shards holding it, and each shard's blocks are kept in LRU order within its cache. Past the deepest
  block, the engine also hits the part of the next block two prompts share (a document's last tokens
  before its question), so each shard also keeps, under the block before them, hashes of the last
  full block and the tail of each prompt it was sent, 16 tokens (the engine's block) at a time: what
  a shard holds is counted in the engine's blocks, not the router's.
- Decision: the shard with the least cost once this request is added: its plan (the work it has, plus the
  growth its groups are expected to add), plus what this prompt adds there (its uncached prefill, and the
  engine steps it adds), plus, where it would recompute a prefix another shard holds, that recompute
  `margin` (1) times more (capacity taken from later requests) and what a group's first request adds on
  average (the hysteresis: a gap that a burst's arrival order opens is about that size, and the next new
  group closes it), plus, off its group's home, the growth that would follow it there. "Any match" never
  decides, so a shared system prompt does not pull every request to one shard once every shard holds it.
- Growth booking: requests are grouped by their first block past any shared head (a conversation, a
  document and its questions); per group the router learns its requests so far and what each later one
  added, and books on the group's home shard what it is still expected to add: a request for each turn
  that the groups which went furthest reached (at least one group in 16), each of what its own later
  requests added (one-request groups: what every group's later requests added, on average, as often as
  the groups old enough to have had a second request, twice the mean wait for one, had one). A new
  group so goes where the work will be least once every group has grown, and a shard whose groups'
  turns came first in the burst is not taken for busier.
- Replication by demand: a group goes to another shard only once its work is more than a shard's fair
  share (the mean plan) and its holders' plans, together, are more than their fair shares (what else
  they hold counts: a hot document's holders busy with other documents too are full before its own work
  is k fair shares), and then only where that is cheaper: a hot document spreads as far as its load
  needs, one shard at a time, and an ordinary one never. A new document then goes to the least planned
  shard the hot one was not spread to (while one is within a decode wave's work of the least planned):
  a shard decodes 64 requests at a time, so a hot document's holders past a wave pay a whole second
  one, and a new document's prefill on top of it made them the burst's slowest (issue 31's hot-doc row).
  A shard's mark goes when its booked requests all complete.
- Load: counted in engine steps (`_work`): a shard's prefill plus a step's fixed cost (`step_tokens`
  prefill tokens) for each step it takes, as many as its prefill needs or its decode does (each
  request's output, `max_seqs` requests at a time), whichever more; booked per request and released by
  `complete`.
- Capacity: blocks per shard from the engine's KV cache (`cache_tokens`); the oldest blocks of a
  full shard are forgotten as the engine would evict them, and the stats say when the live prefixes
  outgrew it (`overflowed`).
- Feedback: `observe` takes each request's cached tokens as the engine reported them, so a trial
  records the router's expected hits beside the realized ones; `follow` keeps the map in step with
  the engines' own KV cache events (`parity.kv_events`): blocks they stored, evicted or cleared.
The router sees token IDs only; an assignment is not proof of a hit (the engines' counts are).
"""

from __future__ import annotations

import bisect
import heapq
import queue
from collections import Counter
from itertools import compress, repeat

import numpy as np

from parity.routing.base import Tokens
from parity.routing.hashing import BLOCK_TOKENS, FINE_TOKENS, fine_chain, salt_of, token_words, word_chain
from parity.study import OUTPUT_TOKENS

STEP_TOKENS = 940  # an engine step's fixed cost in prefill tokens (fixed_s / prefill_token_s on the calibrated H200)
REBOOK = 8  # shards whose growth a decision books anew after the expected turns rose (`PrefixRouter._rebook`)
BATCH_TOKENS, MAX_SEQS = 8192, 64  # what one step computes at most: tokens, sequences (vLLM's defaults here)


class PrefixRouter:
    """Longest-prefix, least-work routing over `num_shards` shards; see the module docstring."""

    # parity.routing.base.Router: follow/sync, complete, observe, cache_tokens/overflowed, quote/commit
    follows_kv_events = released_on_completion = observes = models_cache = quotes = True

    def __init__(self, num_shards: int, revision: str, *, cache_tokens: int, block_tokens: int = BLOCK_TOKENS,
                 output_tokens: int = OUTPUT_TOKENS, margin: float = 1.0, step_tokens: float = STEP_TOKENS,
                 batch_tokens: int = BATCH_TOKENS, max_seqs: int = MAX_SEQS):
        if num_shards < 1:
            raise ValueError(f"need at least one shard, got num_shards={num_shards}")
        if cache_tokens < block_tokens:
            raise ValueError(f"cache_tokens ({cache_tokens}) must hold at least one block of {block_tokens}")
        if block_tokens % FINE_TOKENS:
            raise ValueError(f"block_tokens ({block_tokens}) must be whole engine blocks of {FINE_TOKENS} tokens")
        self.num_shards, self.block_tokens = num_shards, block_tokens
        # a shard's work in prefill tokens: its prefill, plus a step's fixed cost per step, where it takes as many
        # steps as its prefill needs or its decode does (each request's output, max_seqs at a time), whichever more
        self._per_token = step_tokens / batch_tokens
        self._per_seq = step_tokens * output_tokens / max_seqs
        self._wave = step_tokens * output_tokens  # a decode wave's steps (a request's output), in prefill tokens
        self.margin = margin  # a held prefix recomputed elsewhere counts (1 + margin) times
        self.cache_tokens, self.capacity_blocks = cache_tokens, cache_tokens // block_tokens
        self._salt = salt_of(revision)
        self._holders: dict[int, int] = {}  # block hash -> bit mask of the shards holding it
        self._extends: set[int] = set()  # blocks some prompt went on from (with a block that was not its last)
        self._heads: set[int] = set()  # blocks after which two or more different blocks went on
        # per shard, block -> when last used (requests routed before, times a million, less the block's depth:
        # the least is evicted first, so within one prompt its deepest blocks go first, as in vLLM)
        self._held: list[dict[int, int]] = [{} for _ in range(num_shards)]
        self._tails: list[dict[int, set[int]]] = [{} for _ in range(num_shards)]  # block before -> fine hashes
        # (`fine_chain`: of the block after it; the key is what chains them to the prefix)
        self._loads = [0.0] * num_shards  # `_work` of each shard's booked prefill and requests
        self._prefill, self._seqs = [0] * num_shards, [0] * num_shards
        # growth booking (`_grow`, `_refit`): per prefix group (an index, keyed by its first block past any shared
        # head), its home shard (-1: forgotten), work booked, requests and its first request's work; what each group
        # is still expected to add is booked on its home in `_future`. A refit reads running sums, kept as groups
        # change, not the groups themselves (it was the p99 of a decision at 64 shards)
        self._groups: dict[int, int] = {}
        self._home: list[int] = []
        self._work_of: list[float] = []
        self._count: list[int] = []
        self._first: list[float] = []
        self._born: list[int] = []  # the routing index of each group's first request
        self._kind = bytearray()  # per group: 0 forgotten, 1 one request, 2 more (what a refit counts, at C speed)
        self._gaps = [0, 0]  # requests between a group's first and second, summed; groups that had a second
        self._later = 0  # the live groups' requests after their first, summed (what `_refit` divides by)
        self._added = self._firsts = 0.0  # the live groups' work after their first request, and of it, summed
        self._ones = [0] * num_shards  # per home shard, its live groups of one request
        # per request count c >= 2 and home shard: what a later request of its live groups added, summed, and how
        # many groups (an empty sum is set to 0.0, not left as its rounding)
        self._each: list[list[float]] = [[], []]
        self._many: list[list[int]] = [[], []]
        self._future = [0.0] * num_shards
        self._plan = [0.0] * num_shards  # per shard, its load plus its future: what decisions weigh
        self._reached = [0, 0]  # groups (ever) that reached n requests, per n
        self._turns, self._per_turn, self._refit_at = 1, 0.0, 16
        self._fitted = 1  # the `_turns` that `_future` was last booked for in full
        self._rebooked = num_shards  # shards booked anew for `_fitted` so far (`_rebook`: a few per decision)
        self._settle = 0.0  # what a group's first request adds, on average: a gap arrival order opens is about that
        self._completed: queue.SimpleQueue = queue.SimpleQueue()  # routing indices of finished requests
        self._requests = self._replicated = self._evicted = 0
        self._expected: list[int] = []  # cached tokens the router expects, per request in routing order
        self._booked: list[tuple[int, int]] = []  # (shard, uncached prefill) per request; prefill -1 once complete
        self._realized: list[int] | None = None
        self._changes: queue.SimpleQueue | None = None  # the engines' cache changes, when following them
        self._followed: Counter = Counter()
        self.overflowed = False
        self._hot = bytearray(num_shards)  # shards a hot document was spread to (`quote`): new documents go elsewhere

    @property
    def salt(self) -> int:
        """What block hashes are salted with (`salt_of`; `parity.kv_events` derives the same hashes)."""
        return self._salt

    def follow(self, changes: queue.SimpleQueue) -> None:
        """Keep the map in step with the engines: before each decision, apply the (shard, "stored" | "removed"
        | "cleared", router block hashes) queued by a `parity.kv_events.Subscriber`."""
        self._changes = changes

    def sync(self) -> None:
        """Apply the engines' changes queued so far (each decision does so too)."""
        self._apply_changes()

    def _apply_changes(self) -> None:
        while self._changes is not None:
            try:
                shard, kind, hashes = self._changes.get_nowait()
            except queue.Empty:
                return
            self._followed[kind] += 1
            if kind == "stored":
                held, bit, used = self._held[shard], 1 << shard, self._requests << 20
                for block in hashes:
                    if block not in held:
                        held[block] = used
                        self._holders[block] = self._holders.get(block, 0) | bit
            elif kind == "removed":
                for block in hashes:
                    self._drop(shard, block)
                self._evicted += len(hashes)
                self.overflowed = self.overflowed or bool(hashes)
            else:
                for block in list(self._held[shard]):
                    self._drop(shard, block)
                self._tails[shard].clear()

    def _drop(self, shard: int, block: int) -> None:
        """`shard` no longer holds `block`."""
        if self._held[shard].pop(block, None) is None:
            return
        self._tails[shard].pop(block, None)
        left = self._holders[block] & ~(1 << shard)
        if left:
            self._holders[block] = left
        else:
            del self._holders[block]
            group = self._groups.pop(block, None)  # a group none holds any more is expected to grow no more
            if group is not None:
                self._forget(group)
            self._extends.discard(block)
            self._heads.discard(block)

    def _depths(self, chain: list[int]) -> tuple[dict[int, int], int]:
        """The shards holding the first block of `chain`, each with how many leading blocks it holds; and the
        depth of the shared head the chain starts with (0: none).

        A shared head is a prefix that several continuations went on from (a system prompt before many
        documents): its last block has two or more different blocks after it that go on further.
        Recomputing it on another shard is not replication, since every shard needs it once."""
        holders, heads = self._holders, self._heads
        depths: dict[int, int] = {}
        shared, depth = 0, 0
        still = holders.get(chain[0], 0) if chain else 0  # shards holding every block so far
        while still and depth < len(chain):
            if chain[depth] in heads:
                shared = depth + 1
            if still & (still - 1) == 0:  # one shard left: its blocks are a prefix, so bisect the rest
                low, high = depth + 1, len(chain)
                if self._changes is None and holders.get(chain[-1], 0) & still:  # modelled, no block is missing
                    low = high  # inside a held chain (`_evict` drops a chain's deepest first): the whole prompt, a hit
                while low < high:
                    middle = (low + high + 1) // 2
                    if holders.get(chain[middle - 1], 0) & still:
                        low = middle
                    else:
                        high = middle - 1
                if heads:
                    shared = max([shared] + [d + 1 for d in range(depth + 1, low) if chain[d] in heads])
                depths[still.bit_length() - 1] = low
                return depths, shared
            depth += 1
            after = still & holders.get(chain[depth], 0) if depth < len(chain) else 0
            left = still & ~after  # these shards hold `depth` leading blocks
            while left:
                low = left & -left
                depths[low.bit_length() - 1] = depth
                left ^= low
            still = after
        return depths, shared

    def _before(self, chain: list[int], block: int) -> int:
        return chain[block - 1] if block else self._salt

    def route(self, tokens: Tokens) -> int:
        """The shard for this prompt; books its work there and remembers its blocks on that shard."""
        return self.commit(self.quote(tokens))

    def quote(self, tokens: Tokens) -> "Quote":
        """The decision for this prompt without booking it: the chosen shard and what each shard would hold of
        it. Nothing changes until `commit` (so a caller may decline it: parity.admission)."""
        self._apply_changes()
        self._release()
        words = token_words(tokens)
        chain = word_chain(words, self._salt, self.block_tokens)
        depths, shared = self._depths(chain)
        quote = Quote(self, words, chain, depths, shared, len(tokens))
        plan, deepest = self._plan, quote.deepest
        # Each shard is weighed by its plan: the work booked there plus what its groups are expected to grow by
        # (growth booking), so a new group goes where the work will be least once every group has grown, and a
        # gap that arrival order alone opens (a group's turns arriving before the others') is no reason to move.
        # A shard that would recompute a prefix another holds pays that recompute (1 + margin) times in the
        # comparison: once as its own work, `margin` times as capacity taken from later requests (the
        # hysteresis). So a document is replicated only when its holder's plan exceeds another shard's by more
        # than (1 + margin) times its prefix: a hot document spreads as far as its demand needs, one shard at a
        # time. Of the shards holding nothing, only the least planned can be cheapest.
        group = quote.group = self._groups.get(chain[shared]) if shared < len(chain) else None  # `_group`
        if group is not None:
            quote.home, quote.ahead = self._home[group], self._ahead(group)
        # replication by demand: a group goes to one more shard only once its work is more than a shard's fair
        # share (the mean plan), and its holders are, together, above theirs (their other work counts too); else
        # its holders are the candidates (and the least planned shard need not be found)
        holders = [] if group is None else list(depths) if len(depths) == 1 else [
            s for s, d in depths.items() if d >= deepest]
        stays = False
        if holders:
            fair = sum(plan) / self.num_shards
            stays = self._work_of[group] <= fair or sum(plan[h] for h in holders) <= len(holders) * fair
            # a hot document: asked more than twice as often as the groups reach (`_turns`), so not a tenant's
            # documents or a conversation, which the growth booking expects
            quote.hot = self._count[group] > 2 * self._turns
        if stays:
            candidates = set(holders)
        else:
            candidates = set(depths)
            least = plan.index(min(plan))
            if not depths and 0 < self._hot.count(1) < self.num_shards:  # a new document: off a hot one's shards
                cool = min(compress(range(self.num_shards), (not h for h in self._hot)), key=plan.__getitem__)
                if plan[cool] - plan[least] <= self._wave:
                    least = cool
            candidates.add(least)
        for s in candidates:  # what each holds, computed once (`explain` lists these shards)
            quote.held(s)
        quote.plan = plan  # what `Quote.cost` weighs (and `explain` reads again, only when asked)
        quote.shard = min(candidates, key=quote.cost) if len(candidates) > 1 else candidates.pop()
        return quote

    def _work(self, prefill: int, seqs: int) -> float:
        """A shard's work in prefill tokens with `prefill` tokens to compute and `seqs` requests to answer: the
        prefill, and a step's fixed cost for each step it takes (those its prefill needs, or its decode, whichever
        more: decode rides along with prefill steps, and a hot document's short prompts are decode-bound)."""
        return prefill + max(prefill * self._per_token, seqs * self._per_seq)

    def _group(self, quote: "Quote") -> int | None:
        """The key of the prefix group this prompt belongs to: its first block past any shared head (None for a
        prompt within a shared head or shorter than a block)."""
        return quote.chain[quote.shared] if quote.shared < len(quote.chain) else None

    def _ahead(self, group: int) -> float:
        """What `group` is still expected to add: a request per turn until it has had as many as the groups that
        went furthest (`_turns`), each of what its own later requests added (or, for a group of one request,
        what every group's later requests added per request: `_per_turn`)."""
        turns = self._count[group]
        left = self._turns - turns
        if left <= 0:
            return 0.0
        return left * ((self._work_of[group] - self._first[group]) / (turns - 1) if turns > 1 else self._per_turn)

    def _forget(self, group: int) -> None:
        """Group `group` is expected to grow no more (none holds it, or it was several groups)."""
        self._book(self._home[group], -self._ahead(group))
        self._unfile(group)
        self._home[group] = -1
        self._kind[group] = 0
        self._later -= self._count[group] - 1
        self._added -= self._work_of[group] - self._first[group]
        self._firsts -= self._first[group]

    def _file(self, group: int) -> None:
        """Count live group `group` in the sums a refit reads, under its home and its requests so far."""
        turns, home = self._count[group], self._home[group]
        if turns == 1:
            self._ones[home] += 1
            return
        while turns >= len(self._each):
            self._each.append([0.0] * self.num_shards)
            self._many.append([0] * self.num_shards)
        self._each[turns][home] += (self._work_of[group] - self._first[group]) / (turns - 1)
        self._many[turns][home] += 1

    def _unfile(self, group: int) -> None:
        """Take group `group` out of those sums (before it changes or is forgotten)."""
        turns, home = self._count[group], self._home[group]
        if turns == 1:
            self._ones[home] -= 1
            return
        left = self._many[turns][home] = self._many[turns][home] - 1
        each = self._each[turns]
        each[home] = each[home] - (self._work_of[group] - self._first[group]) / (turns - 1) if left else 0.0

    def _refit(self) -> None:
        """Learn what a later request of a group adds (over all groups so far), and book each group's expected
        growth again; every `max(64, 2 x groups)` requests, and when `_turns` rises. From the running sums `_grow`
        and `_forget` keep, never over the groups (that was the p99 of a decision at 64 shards). Where `_turns` is
        as at the last refit, only the groups of one request book anew (`_turns - 1` of `_per_turn` each): each
        shard's booking moves by its count of them times the change. Where it rose, every group does, shard by
        shard over this and the next few decisions (`_rebook`)."""
        groups = len(self._groups)
        self._refit_at = self._requests + max(64, 2 * groups)
        if not groups:
            return
        per_turn = self._added / self._later if self._later else 0.0
        if self._gaps[1]:  # a group of one request is expected that as often as the groups old enough to have had
            # a second (twice the mean wait for one) had one; groups are born in order, so the old ones lead
            born = bisect.bisect_right(self._born, self._requests - 2 * self._gaps[0] / self._gaps[1])
            old = born - self._kind.count(0, 0, born)  # the live ones
            if old:
                per_turn *= self._kind.count(2, 0, born) / old
        self._settle = self._firsts / groups
        turns, change = self._turns, per_turn - self._per_turn
        self._per_turn = per_turn
        if turns == self._fitted:
            change *= turns - 1
            if change:
                future, plan = self._future, self._plan
                for shard in compress(range(self.num_shards), self._ones):  # those with such groups (at C speed)
                    moved = self._ones[shard] * change
                    future[shard] += moved
                    plan[shard] += moved
            return
        self._fitted, self._rebooked = turns, 0
        self._rebook()

    def _rebook(self) -> None:
        """Book the next `REBOOK` shards' growth anew from the running sums, for the turns `_refit` last fitted:
        c requests of `_turns` add `_turns - c` of what each of their later requests added. A few shards per
        decision, not all in one (at 64 shards a Python pass over them per request count was the p99 of a
        decision); until its turn a shard keeps its growth as booked for the turns before."""
        turns, future, plan, loads, ones = self._fitted, self._future, self._plan, self._loads, self._ones
        each = (turns - 1) * self._per_turn
        rows = [(turns - count, self._each[count]) for count in range(2, min(turns, len(self._each)))]
        start = self._rebooked
        self._rebooked = min(start + REBOOK, self.num_shards)
        for shard in range(start, self._rebooked):
            booked = ones[shard] * each
            for times, row in rows:
                booked = booked + times * row[shard]
            future[shard] = booked
            plan[shard] = loads[shard] + booked

    def _book(self, shard: int, future: float) -> None:
        """Add `future` to the growth booked on `shard`."""
        self._future[shard] += future
        self._plan[shard] += future

    def explain(self, quote: "Quote") -> str:
        """One line on `quote`'s decision (before its commit): per shard it weighed, what it holds of the prompt,
        its booked load, the growth its groups are still expected to add, and its cost (load + growth + the
        prompt's work there + any held prefix recomputed, x margin, + the hysteresis + its group's growth, off
        its home); the chosen one first, and why (a hit, a replica of a held prefix, or the least loaded)."""
        cost, chosen = quote.cost, quote.shard
        weighed = sorted(quote._held, key=lambda s: (s != chosen, cost(s)))
        loads, plan = self._loads, quote.plan
        parts = [f"s{s} holds {quote._held[s]:,}, load {loads[s]:,.0f}, growth {plan[s] - loads[s]:,.0f}, "
                 f"cost {cost(s)[0]:,.0f}" for s in weighed]
        here = quote.depths.get(chosen, 0)
        why = ("a hit" if here and here >= quote.deepest else
               "replica: its holder was busier" if here < quote.deepest and quote.deepest > quote.shared else
               "new: the least loaded")
        return f"{quote.length:,} tokens -> shard {chosen} ({why}): " + "; ".join(parts)

    def commit(self, quote: "Quote", shard: int | None = None) -> int:
        """Book `quote` on `shard` (default: the one it chose) and remember its blocks there; the shard. A quote
        is good until the next `quote` or `commit`."""
        shard = quote.shard if shard is None else shard
        here, deepest, held = quote.depths.get(shard, 0), quote.deepest, quote.held(shard)
        if here < deepest:
            self._replicated += 1  # a held prefix recomputed elsewhere: its holder was the busier
            if quote.hot:  # its holders and this shard are a hot document's
                for s in [shard, *(s for s, d in quote.depths.items() if d >= deepest)]:
                    self._hot[s] = 1
        prefill = quote.length - held
        self._prefill[shard] += prefill
        self._seqs[shard] += 1
        load = self._work(self._prefill[shard], self._seqs[shard])
        work = load - self._loads[shard]  # what `quote.work(shard)` says, computed once
        self._loads[shard] = load
        self._plan[shard] = load + self._future[shard]
        self._grow(quote, shard, work)
        self._remember(shard, quote.chain, quote.fine, here, deepest)
        self._expected.append(held)
        self._booked.append((shard, prefill))
        self._requests += 1
        if self._requests >= self._refit_at:
            self._refit()
        elif self._rebooked < self.num_shards:
            self._rebook()
        return shard

    def _grow(self, quote: "Quote", shard: int, work: float) -> None:
        """Book `work` to the quote's prefix group (a new group's home is `shard`), and what the group is expected to
        add to its home's plan. The expected turns (`_turns`) are those that at least one group in 16 (and two)
        reached: a burst's arrival order moves them up turn by turn, and one hot document asked hundreds of times
        does not. The group and what it was expected to add are the quote's (nothing changed since)."""
        group = quote.group
        if group is None:
            key = self._group(quote)
            if key is None:
                return
            group = self._groups[key] = len(self._home)
            self._home.append(shard)
            self._work_of.append(work)
            self._count.append(1)
            self._first.append(work)
            self._born.append(self._requests)
            self._kind.append(1)
            self._firsts += work
            self._file(group)
            self._reached[1] += 1
            self._book(shard, self._ahead(group))
            return
        before = quote.ahead
        self._unfile(group)
        if shard != self._home[group]:  # its later requests follow it here (a conversation moved, a document
            # replicated)
            self._book(self._home[group], -before)
            self._book(shard, before)
            self._home[group] = shard
        self._work_of[group] += work
        self._count[group] += 1
        self._later += 1
        self._added += work
        self._file(group)
        turns = self._count[group]
        if turns == 2:
            self._kind[group] = 2
            self._gaps[0] += self._requests - self._born[group]
            self._gaps[1] += 1
        if turns == len(self._reached):
            self._reached.append(0)
        self._reached[turns] += 1
        if turns == self._turns + 1 and self._reached[turns] >= max(2, self._reached[1] / 16):
            self._turns = turns
            self._refit_at = self._requests  # every group's expectation changed: refit at this commit's end
        else:
            self._book(shard, self._ahead(group) - before)

    def _remember(self, shard: int, chain: list[int], fine, here: int, known: int) -> None:
        """`shard` holds this chain now (`here`: how many leading blocks it held; `known`: how many any shard held)."""
        held, bit, holders = self._held[shard], 1 << shard, self._holders
        tails, last = self._tails[shard], len(chain) - 1
        for at in (last, last + 1):  # the last full block (unless held already) and the tail, engine block by block
            if at >= here:
                before = self._before(chain, at)
                if before in tails:
                    tails[before].update(fine(at))
                else:
                    tails[before] = set(fine(at))
        # A shared head: a held block after which two different new blocks went on (a question's last block
        # does not go on). Only where a chain leaves what any shard holds can it fork from another.
        if 0 < known < last and chain[known - 1] in self._extends and chain[known - 1] not in self._heads:
            self._heads.add(chain[known - 1])
            for block in chain[:known]:  # a group keyed within what is now a shared head was several groups
                group = self._groups.pop(block, None)
                if group is not None:
                    self._forget(group)
        if known < last:
            self._extends.update(chain[max(known - 1, 0): last - 1])
        # `here` leading blocks are held already, unless the engines' events removed one in the middle of them (a gap
        # `_depths` bisects past): when following events, every block is marked held, as the shard will hold it
        for block in chain if self._changes is not None else chain[here:known]:
            holders[block] = holders.get(block, 0) | bit
        if self._changes is None and known < len(chain):  # modelled: no shard holds a block past the deepest held (a
            # shard's blocks of a chain are a prefix), so they are new to the map: added at C speed
            holders.update(zip(chain[known:], repeat(bit)))
        used = self._requests << 20  # the LRU order (this loop costs less than dict.update over a zip with a range)
        for block in chain:
            held[block] = used
            used -= 1
        if self._changes is None and len(held) > self.capacity_blocks:  # modelled: the engine evicts its LRU
            # blocks (when following the engines' events, their BlockRemoved says what went instead)
            self._evict(shard, len(held) - self.capacity_blocks)

    def _evict(self, shard: int, count: int) -> None:
        """Forget `shard`'s `count` least recently used blocks."""
        held = self._held[shard]
        for block in heapq.nsmallest(count, held, key=held.__getitem__):
            self._drop(shard, block)
        self._evicted += count
        self.overflowed = True

    def complete(self, index: int) -> None:
        """Release the work booked for the `index`-th routed request (it finished on its shard). Safe from any
        thread (a path's reply callback): queued, and applied before the next decision."""
        self._completed.put(index)

    def _release(self) -> None:
        while not self._completed.empty():  # the one consumer: what it saw queued is there to get
            index = self._completed.get_nowait()
            shard, prefill = self._booked[index]
            if prefill >= 0:
                self._prefill[shard] -= prefill
                self._seqs[shard] -= 1
                if not self._seqs[shard]:  # drained: no longer a hot document's
                    self._hot[shard] = 0
                self._loads[shard] = self._work(self._prefill[shard], self._seqs[shard])
                self._plan[shard] = self._loads[shard] + self._future[shard]
                self._booked[index] = (shard, -1)

    def observe(self, cached_tokens: list[int]) -> None:
        """The engine's cached prompt tokens per request, in routing order: the hits that happened."""
        if len(cached_tokens) != len(self._expected):
            raise ValueError(f"observed {len(cached_tokens)} requests, routed {len(self._expected)}")
        self._realized = list(cached_tokens)

    @property
    def requests(self) -> int:
        """Requests booked so far: the next booking's routing index (what `complete` takes)."""
        return self._requests

    @property
    def expected(self) -> list[int]:
        """Cached prompt tokens the router expected, per request in routing order."""
        return list(self._expected)

    @property
    def loads(self) -> list[int]:
        """Work booked on each shard and not yet released (uncached prompt tokens plus output tokens)."""
        self._release()
        return list(self._loads)

    def stats(self) -> dict:
        expected = sum(self._expected)
        realized = None if self._realized is None else sum(self._realized)
        return {"policy": "prefix", "requests": self._requests, "loads": self.loads,
                "replicated": self._replicated, "block_tokens": self.block_tokens,
                "capacity_blocks": self.capacity_blocks, "held_blocks": [len(h) for h in self._held],
                "evicted_blocks": self._evicted, "overflowed": self.overflowed,
                "expected_cached_tokens": expected, "realized_cached_tokens": realized,
                "expected_vs_realized": None if not realized else expected / realized,
                "engine_changes": dict(self._followed) if self._changes is not None else None,
                "growth": {"groups": len(self._groups), "expected_turns": self._turns, "per_turn": self._per_turn,
                           "hysteresis": self._settle, "booked": list(self._future)}}


class Quote:
    """One prompt's routing decision before it is booked (`PrefixRouter.quote`): the shard chosen, and per shard
    the tokens of the prompt it holds and the work the prompt would add there (uncached prefill plus decode)."""

    __slots__ = ("_router", "_words", "chain", "depths", "shared", "length", "deepest", "shard", "_fine", "_held",
                 "plan", "group", "home", "ahead", "hot")

    def __init__(self, router: PrefixRouter, words: np.ndarray, chain: list[int], depths: dict[int, int],
                 shared: int, length: int):
        self._router, self._words, self.chain, self.depths, self.shared = router, words, chain, depths, shared
        self.length, self.deepest = length, max(depths.values(), default=0)
        self.shard = -1
        self.group: int | None = None
        self.home, self.ahead = -1, 0.0  # its group's home shard and what the group is still expected to add
        self.hot = False  # its group is a hot document (`PrefixRouter.quote`)
        self._fine: dict[int, list[int]] = {}
        self._held: dict[int, int] = {}

    def fine(self, at: int) -> list[int]:
        """Block `at`'s engine-block hashes, computed once per decision."""
        if at not in self._fine:
            self._fine[at] = fine_chain(self._words, at, self._router.block_tokens)
        return self._fine[at]

    def held(self, shard: int) -> int:
        """Tokens of this prompt `shard` holds (the hit the router expects there), computed once: its leading
        blocks, and of the next block what an earlier prompt sent there shares (whole engine blocks), at most the
        prompt less one token (the engine always computes the last)."""
        held = self._held.get(shard)
        if held is None:
            r, blocks = self._router, self.depths.get(shard, 0)
            held = blocks * r.block_tokens
            tails = r._tails[shard].get(self.chain[blocks - 1] if blocks else r._salt)
            if tails:
                for hashed in self.fine(blocks):
                    if hashed not in tails:
                        break
                    held += FINE_TOKENS
            held = self._held[shard] = min(held, (self.length - 1) // FINE_TOKENS * FINE_TOKENS)
        return held

    def cost(self, shard: int) -> tuple:
        """What the router weighs for `shard` (least first; `PrefixRouter.quote` says why): its plan, the group's
        growth if `shard` is not the group's home, this prompt's work there, and a held prefix recomputed there,
        (1 + margin) times, with the hysteresis. A method, not a closure kept on the quote: a quote then holds no
        reference cycle, so it is freed as soon as it is dropped, not by the garbage collector."""
        r, plan = self._router, self.plan
        again = max(0, self.deepest - self.depths.get(shard, 0))  # blocks of a held prefix recomputed
        follows = self.ahead if self.home >= 0 and shard != self.home else 0.0  # the group's growth goes with it
        # the hysteresis: what a group's first request adds, on average, learned at each refit; before the first,
        # a prompt that opens a group is itself such a request, so its own length stands in (else in a burst's
        # first decisions, nothing booked yet, every tenant's new document went to an empty shard and split it)
        settle = r._settle or (self.length if self.group is None else 0.0)
        moved = r.margin * again * r.block_tokens + (settle if again else 0.0)
        return (plan[shard] + follows + self.work(shard) + moved, plan[shard], shard)

    def work(self, shard: int) -> float:
        """What this prompt would add to `shard`'s booked work: its uncached prefill there, and the steps it adds."""
        r = self._router
        return r._work(r._prefill[shard] + self.length - self.held(shard), r._seqs[shard] + 1) - r._loads[shard]

    @property
    def loads(self) -> list[int]:
        """Each shard's booked work as this decision saw it (not a copy: read it before the next decision)."""
        return self._router._loads
