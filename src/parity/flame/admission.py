"""The order in which the Flame adapter admits one batch's prompts into its engine.

A batch arrives whole, so the adapter may choose the order that vLLM's first-come scheduler sees:

- `arrival`: the order the client sent, what an HTTP server's engine sees.
- `prefix`: prompts sorted by their token IDs, so prompts that share a prefix become neighbours at
  whatever depth they share it. A document's first prompt is then followed by its siblings: vLLM
  caches a block when it schedules it, so the siblings hit the document's blocks in the same step and
  their few question tokens fill that step's token budget. In arrival order, siblings trail far behind
  and pile up at the end of a burst, where `max_num_seqs` caps the running set and steps run almost
  empty. Groups come in token order, not arrival order: fine for a burst, not for sustained load.

Outputs always go back in input order; only admission changes. The standalone vLLM reference keeps
the arrival order its HTTP clients give it.
"""

from __future__ import annotations

from typing import Sequence

from parity.errors import ParityError

ORDERS = ("arrival", "prefix")


def check(order: str) -> str:
    """The order, or a clear error for one this module does not know."""
    if order not in ORDERS:
        raise ParityError(f"unknown admission order {order!r}: use one of {', '.join(ORDERS)}")
    return order


def admission_order(prompts: Sequence[Sequence[int]], order: str) -> list[int]:
    """Input positions in the order to admit them (a permutation of range(len(prompts)))."""
    if check(order) == "arrival":
        return list(range(len(prompts)))
    import numpy as np  # here, so the command line can name ORDERS without loading numpy

    # big-endian bytes compare as the token sequences do; equal prompts keep arrival order
    keys = [np.asarray(p, dtype=">u4").tobytes() for p in prompts]
    return sorted(range(len(prompts)), key=keys.__getitem__)
