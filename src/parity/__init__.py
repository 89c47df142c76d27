"""parity: the reproducibility artifact for "Bringing Flame Serving Close to Standalone vLLM"."""

__version__ = "0.1.0"
