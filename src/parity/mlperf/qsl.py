"""LoadGen's query sample library over the dataset's pre-tokenized prompts (held in memory)."""

from __future__ import annotations

from parity.mlperf.dataset import Dataset
from parity.mlperf.settings import loadgen


class PromptQSL:
    """Every prompt is in memory already, so load/unload only record which samples LoadGen chose."""

    def __init__(self, dataset: Dataset, performance_count: int):
        self.prompts = dataset.prompts
        self.performance_count = min(performance_count, len(self.prompts))
        self.loaded: set[int] = set()
        lg = loadgen()
        self.handle = lg.ConstructQSL(len(self.prompts), self.performance_count, self._load, self._unload)

    def _load(self, indices) -> None:
        self.loaded.update(int(i) for i in indices)

    def _unload(self, indices) -> None:
        self.loaded.difference_update(int(i) for i in indices)

    def close(self) -> None:
        if self.handle is not None:
            loadgen().DestroyQSL(self.handle)
            self.handle = None
