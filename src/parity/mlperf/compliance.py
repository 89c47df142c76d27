"""An MLPerf Offline run's compliance label: whether it could stand as a result under the rules, and every reason
it cannot. `parity mlperf run` writes it and `parity validate` derives it again from what the run links
(`logs.derived_problems`), so a label edited to "compliant" is named."""

from __future__ import annotations

from parity.mlperf import DATASET_SAMPLES, MAX_NEW_TOKENS, MIN_DURATION_MS


def compliance(mode: str, args, result: dict, dataset, simulated: bool, failed: int) -> dict:
    """Whether the run could stand as an Offline result; every reason it cannot: from its LoadGen logs (`result`:
    `logs.read_logs`), its dataset, its engine arguments (`args`: max_tokens, ignore_eos) and its failed samples."""
    reasons = []
    effective = result["effective"]
    if mode == "performance":
        if result["validity"] != "VALID":
            reasons.append(f"LoadGen says {result['validity']}")
        if (result["duration_s"] or 0) < MIN_DURATION_MS / 1000:
            reasons.append(f"ran {result['duration_s'] or 0:.1f} s, under {MIN_DURATION_MS // 1000} s")
        if (effective.get("min_duration_ms") or 0) < MIN_DURATION_MS:
            reasons.append(f"min_duration set to {effective.get('min_duration_ms')} ms (rules: {MIN_DURATION_MS})")
        if (result["sample_count"] or 0) < DATASET_SAMPLES:
            reasons.append(f"{result['sample_count']} samples, fewer than the {DATASET_SAMPLES:,}-sample pool")
        if (effective.get("performance_sample_count") or 0) < DATASET_SAMPLES:
            reasons.append(f"performance pool of {effective.get('performance_sample_count')} samples "
                           f"(rules: {DATASET_SAMPLES:,})")
    elif len(dataset.prompts) < DATASET_SAMPLES:
        reasons.append(f"accuracy over {len(dataset.prompts)} samples, not all {DATASET_SAMPLES:,}")
    if dataset.synthetic:
        reasons.append(f"synthetic dataset ({dataset.origin})")
    if simulated:
        reasons.append("simulated engine")
    if args.max_tokens != MAX_NEW_TOKENS or args.ignore_eos:
        reasons.append(f"generation differs from max_new_tokens={MAX_NEW_TOKENS}, min_new_tokens=1")
    if failed:
        reasons.append(f"{failed} sample(s) failed")
    reasons += [f"LoadGen error: {e}" for e in result["detail_errors"]]
    return {"compliant": not reasons, "reasons": reasons}
