"""The MLPerf Inference v5.1.1 Llama 3.1 8B Offline control, apart from the study's own experiments.

Real LoadGen (`mlcommons-loadgen==5.1.1`) drives one serving path per process: the QSL holds the
dataset's pre-tokenized prompts, the SUT hands them to the standalone path (HTTP to replicas) or the
Flame path (batched tasks), and completes each sample with its output token IDs. Settings come from
the `mlperf.conf` compiled into LoadGen plus a `user.conf` written per run. LoadGen loads
`mlperf.conf` only on the first `FromConfig` call in a process, so each arm and mode runs in its own
process (`parity mlperf run`). A run shorter than 600 s, or over fewer samples than the 13,368-sample
pool, is labelled non-compliant whatever LoadGen says.
"""

MODEL = "llama3_1-8b"  # LoadGen's model name in mlperf.conf
SCENARIO = "Offline"
LOADGEN_VERSION = "5.1.1"  # the study's "v5.1.1 LoadGen source"; 6.0.x embeds other RNG seeds
DATASET_SAMPLES = 13_368  # CNN/DailyMail 3.0.0 validation: the total and the performance pool
MIN_DURATION_MS = 600_000
MAX_NEW_TOKENS = 128  # inference_rules: max_new_tokens 128, min_new_tokens 1, greedy
ARMS = ("standalone", "flame")
MODES = ("performance", "accuracy")
