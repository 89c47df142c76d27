"""The study's experiments as lists of cases, run on fresh engines, one trial manifest per case.

- `backend`: where cases run (simulator or vLLM, which GPUs, Flame stand-in or v0.6.0), from config;
- `plan`: the cases of each experiment (locality, admission, confirmation, gc), interleaved, pure;
- `runner`: runs cases through the two serving paths, checks every trial, writes pairs and a summary;
- `offline_limit`: each shard's prompts handed to the engine at once on its GPU, the ceiling of both paths.
Nothing here computes statistics beyond what the summary points at; that is `parity.stats`.
"""
