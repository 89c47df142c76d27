"""What every router is: the tokens it is given (`Tokens`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

Tokens = Sequence[int] | np.ndarray
