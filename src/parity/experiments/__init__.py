"""The study's experiments as lists of cases, run on fresh engines, one trial manifest per case.

- `backend`: where cases run (simulator or vLLM, which GPUs, Flame stand-in or v0.6.0), from config;
- `settings`: each experiment's settings (the config's experiments.NAME), one frozen dataclass, defaults declared once;
- `plan`: the cases of each experiment (locality, admission, confirmation, gc; ours: routing), interleaved, pure;
  `plan.EXPERIMENTS` registers each experiment's settings class with its plan;
- `runner`: runs each case on the serving path it names (`parity.paths`) through one trial lifecycle
  (`parity.trial`), writes pairs and the experiment manifest;
- `offline_limit`: each shard's prompts handed to the engine at once on its GPU, the ceiling of both paths.
Nothing here computes statistics beyond what the summary points at; that is `parity.stats`.
"""
