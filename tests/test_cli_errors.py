"""Bad input and a hostile environment end in one `Error: ...` line, never a traceback, and leave nothing half.

Bad input is a ParityError or a click usage error; an OSError of the user's machine (a full disk, a
read-only folder, a file where a folder belongs) names the path and the reason. A genuine bug keeps
its traceback.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pathlib

import click
import pytest
from click.testing import CliRunner

from parity.cli import main
from parity.cli.errors import ENVIRONMENT_ERRORS, friendly_errors
from parity.trial import log_summary


def leaf_commands(group: click.Group, prefix=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, prefix + (name,))
        else:
            yield prefix + (name,), command


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result) -> str:
    """The single `Error: ...` line of a failed command (the exception, if it was a traceback)."""
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


def test_every_command_turns_errors_into_one_line():
    wrapper = friendly_errors(lambda: None).__code__
    unwrapped = [" ".join(path) for path, command in leaf_commands(main) if command.callback.__code__ is not wrapper]
    assert unwrapped == []


@pytest.mark.parametrize("code", sorted(ENVIRONMENT_ERRORS))
def test_an_oserror_of_the_environment_is_one_line_naming_path_and_reason(code):
    @click.command()
    @friendly_errors
    def command():
        raise OSError(code, os.strerror(code), "/some/out/file.json")

    result = CliRunner().invoke(command, [])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output == f"Error: /some/out/file.json: {ENVIRONMENT_ERRORS[code]}\n"


@pytest.mark.parametrize("error", [OSError(errno.ECONNREFUSED, "Connection refused"), ValueError("a bug"),
                                   KeyError("trace")])
def test_other_errors_keep_their_traceback(error):
    @click.command()
    @friendly_errors
    def command():
        raise error

    result = CliRunner().invoke(command, [])
    assert result.exception is error


def test_out_naming_a_file_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    assert one_error_line(invoke("smoke-inputs", "--out", afile, "--articles", 2)) == \
        f"Error: {afile}: exists and is not a folder"
    assert one_error_line(invoke("mlperf", "random-dataset", "--out", afile / "d.json", "--samples", 2)) == \
        f"Error: {afile}: a part of this path is a file, not a folder"
    assert afile.read_text() == "not a folder"


def test_out_naming_an_input_is_one_line_and_the_input_survives(tmp_path):
    """An outside tester's: compare --out RUN/mlperf-run.json overwrote the standalone run; smoke-dataset --out
    TOKENIZER/tokenizer.json replaced the tokenizer."""
    run, flame, tokenizer = tmp_path / "run.json", tmp_path / "flame.json", tmp_path / "tok"
    tokenizer.mkdir()
    for path in (run, flame, tokenizer / "tokenizer.json"):
        path.write_text("kept")
    (tmp_path / "link.json").symlink_to(run)
    for out in (run, tmp_path / "link.json", tmp_path / "tok" / ".." / "run.json"):
        line = one_error_line(invoke("mlperf", "compare", "--standalone", run, "--flame", flame, "--out", out))
        assert line == (f"Error: {out}: a link, which the command would replace by a file: give the path of a "
                        "file, or of none yet" if out.is_symlink() else
                        f"Error: --out {out} is the command's input --standalone {run}: give an --out apart from "
                        f"the inputs")
    line = one_error_line(invoke("mlperf", "smoke-dataset", "--tokenizer", tokenizer, "--out",
                                 tokenizer / "tokenizer.json"))
    assert line.startswith(f"Error: --out {tokenizer / 'tokenizer.json'} lies in the command's input --tokenizer ")
    line = one_error_line(invoke("mlperf", "accuracy", run, "--tokenizer", tokenizer, "--out", run))
    assert line.startswith(f"Error: --out {run} is the command's input RUN_MANIFEST ")
    assert all(p.read_text() == "kept" for p in (run, flame, tokenizer / "tokenizer.json"))


def test_a_run_folder_holding_its_dataset_is_one_line_and_the_dataset_survives(tmp_path):
    """`mlperf run --out` is a folder it writes user.conf, loadgen/ and mlperf-run.json into: a dataset kept there
    (here under the name the run's manifest takes) was overwritten. Refused before anything starts."""
    folder = tmp_path / "run"
    folder.mkdir()
    dataset = folder / "mlperf-run.json"
    dataset.write_text("kept")
    line = one_error_line(invoke("mlperf", "run", "--arm", "standalone", "--dataset", dataset, "--out", folder))
    assert line == f"Error: --out {folder} holds the command's input --dataset {dataset}: give an --out apart from " \
                   "the inputs"
    assert dataset.read_text() == "kept" and sorted(folder.iterdir()) == [dataset]


def mooncake_line(timestamp=0):
    return json.dumps({"timestamp": timestamp, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}) + "\n"


def test_a_trace_named_after_its_source_is_one_line_and_the_source_survives(tmp_path, monkeypatch):
    """`trace-mooncake t.json --out .` named the trace after the file's stem, so its manifest t.json replaced the
    Mooncake trace it read (and x.tokens was overwritten by NAME.tokens): the names it writes into --out are
    checked against its inputs before anything is written."""
    monkeypatch.chdir(tmp_path)
    pathlib.Path("t.json").write_text(mooncake_line())
    pathlib.Path("x.tokens").write_text(mooncake_line())
    line = one_error_line(invoke("trace-mooncake", "t.json", "--out", "."))
    assert line == "Error: --out . would write t.json, which is the command's input SOURCE t.json: give another " \
                   "--out or --name"
    line = one_error_line(invoke("trace-mooncake", "x.tokens", "--out", tmp_path, "--name", "x"))
    assert line.startswith(f"Error: --out {tmp_path} would write {tmp_path / 'x.tokens'}, which is the command's "
                           "input SOURCE x.tokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "x.tokens"]
    assert pathlib.Path("t.json").read_text() == pathlib.Path("x.tokens").read_text() == mooncake_line()
    invoke("trace-mooncake", "t.json", "--out", ".", "--name", "other")  # a folder may hold its source by another name
    assert (tmp_path / "other.json").is_file() and pathlib.Path("t.json").read_text() == mooncake_line()


def test_a_trace_written_over_its_corpus_or_tokenizer_is_one_line_and_both_survive(tmp_path, monkeypatch):
    """`trace --tokenizer tok --name tokenizer --out tok` replaced tok/tokenizer.json by the trace's manifest, and
    `--corpus r.json --name r --out .` the corpus: refused up front."""
    monkeypatch.chdir(tmp_path)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("kept")
    pathlib.Path("r.json").write_text("kept")
    trace = ["trace", "--corpus", "r.json", "--tokenizer", "tok", "--documents", 2, "--questions", 1,
             "--prefix-tokens", 50]
    line = one_error_line(invoke(*trace, "--name", "tokenizer", "--out", "tok"))
    assert line == "Error: --out tok is the command's input --tokenizer tok: give an --out apart from the inputs"
    line = one_error_line(invoke(*trace, "--name", "r", "--out", "."))
    assert line == "Error: --out . would write r.json, which is the command's input --corpus r.json: give another " \
                   "--out or --name"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "tok"] and list(tok.iterdir()) == [tok / "tokenizer.json"]
    assert (tok / "tokenizer.json").read_text() == pathlib.Path("r.json").read_text() == "kept"


@pytest.mark.parametrize("command", [["fetch", "url"], ["fetch", "articles"], ["fetch", "dataset"]])
def test_a_receipt_over_the_pins_or_in_the_destination_is_one_line_and_both_survive(tmp_path, command):
    """`fetch url --receipt PINS` overwrote the pins file with the receipt, and `--receipt DEST/a.txt` a file it had
    just verified: every fetch command refuses a --receipt that is its pins file or lies in --dest (made or not
    yet), before it reads or fetches anything."""
    pins, dest = tmp_path / "pins.json", tmp_path / "dest"
    pins.write_text("kept")
    line = one_error_line(invoke(*command, "--pins", pins, "--dest", dest, "--receipt", pins))
    assert line == f"Error: --receipt {pins} is the command's input --pins {pins}: give a --receipt apart from the " \
                   "inputs"
    line = one_error_line(invoke(*command, "--pins", pins, "--dest", dest, "--receipt", dest / "a.txt"))
    assert line == f"Error: --receipt {dest / 'a.txt'} lies in the command's input --dest {dest}: give a --receipt " \
                   "apart from the inputs"
    dest.mkdir()
    (dest / "a.txt").write_text("verified")
    link = tmp_path / "link.txt"
    link.symlink_to(dest / "a.txt")
    line = one_error_line(invoke(*command, "--pins", pins, "--dest", dest, "--receipt", link))
    assert line.startswith(f"Error: --receipt {link} lies in the command's input --dest {dest}")
    assert pins.read_text() == "kept" and (dest / "a.txt").read_text() == "verified"
    assert sorted(tmp_path.iterdir()) == [dest, link, pins] and list(dest.iterdir()) == [dest / "a.txt"]


def test_smoke_inputs_refuses_a_vocabulary_past_int32_and_never_leaves_half_its_output(tmp_path, monkeypatch):
    """`smoke-inputs --vocab-size 99999999999999999999` printed a traceback (an OverflowError in the tokenizer
    trainer) and left corpus.jsonl without tokenizer/: the size is bounded by the int32 token IDs (2**31, as
    SimParams' vocab_size), and a training that fails takes the corpus with it."""
    out = tmp_path / "out"
    result = invoke("smoke-inputs", "--out", out, "--articles", 2, "--vocab-size", 99999999999999999999)
    assert result.exit_code == 2 and "Invalid value for '--vocab-size'" in one_error_line(result)
    assert "2147483648" in result.output and not out.exists()

    from parity import smoke_inputs

    def full_disk(corpus, tokenizer_dir, vocab_size):
        tokenizer_dir.mkdir(parents=True)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tokenizer_dir / "tokenizer.json"))

    monkeypatch.setattr(smoke_inputs, "train_tokenizer", full_disk)
    line = one_error_line(invoke("smoke-inputs", "--out", out, "--articles", 2))
    assert line == f"Error: {out / 'tokenizer' / 'tokenizer.json'}: no space left on the device"
    assert not out.exists()
    out.mkdir()
    assert one_error_line(invoke("smoke-inputs", "--out", out, "--articles", 2)).startswith("Error: ")
    assert list(out.iterdir()) == []  # --out kept where it was there before, emptied of what the command wrote


def test_a_mooncake_trace_that_is_no_regular_file_is_named_as_such(tmp_path):
    """`trace-mooncake /dev/null` and `bench routing --trace-file /dev/null` said "Mooncake trace not found" of a
    path that exists: it is not a regular file."""
    for command in (["trace-mooncake", "/dev/null", "--out", tmp_path / "o"], ["bench", "routing", "--trace-file", "/dev/null"]):
        assert one_error_line(invoke(*command)) == "Error: Mooncake trace is not a regular file: /dev/null"
    line = one_error_line(invoke("trace-mooncake", tmp_path / "missing.json", "--out", tmp_path / "o"))
    assert line == f"Error: Mooncake trace not found: {tmp_path / 'missing.json'}"
    assert not (tmp_path / "o").exists()


def test_out_inside_a_file_is_one_line(small_reuse_trace, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    line = one_error_line(invoke("bench", "order", "--trace", small_reuse_trace, "--repeats", 1,
                                 "--warmup-rounds", 0, "--out", afile))
    assert line == f"Error: {afile}: exists and is not a folder"  # refused as the command line is read


@pytest.mark.parametrize("command", [("bench", "admission", "--requests", 4, "--repeats", 1, "--out", "/proc/x.json"),
                                     ("trace-mooncake", "/dev/null", "--out", "/proc/mooncake"),
                                     ("mlperf", "random-dataset", "--samples", 2, "--out", "/proc/d.json")])
def test_out_where_no_file_can_be_made_is_one_line_before_the_work(command):
    """/proc refuses new files whatever its permissions say (ENOENT, not an environment error friendly_errors knows):
    each --out is tried as the command line is read."""
    if not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    assert one_error_line(invoke(*command)) == "Error: /proc: cannot make a file there (No such file or directory)"


def test_a_name_too_long_is_one_line(tmp_path):
    out = tmp_path / ("x" * 300)
    assert one_error_line(invoke("smoke-inputs", "--out", out, "--articles", 2)) == \
        f"Error: {out}: file name too long"


def test_summary_log_on_a_full_disk_is_cut_back_to_whole_lines(tmp_path, monkeypatch):
    log_summary(tmp_path, {"trial": 1})
    before = (tmp_path / "summary.jsonl").read_bytes()
    real_open = pathlib.Path.open

    class HalfThenFull(io.FileIO):
        """Takes half of the first write, then reports a full disk."""
        writes = 0

        def write(self, data):
            HalfThenFull.writes += 1
            if HalfThenFull.writes > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(bytes(data[:len(data) // 2]))

    def fake_open(self, mode="r", buffering=-1, *args, **kwargs):
        if self.name == "summary.jsonl" and mode == "ab":
            return HalfThenFull(self, "ab")
        return real_open(self, mode, buffering, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", fake_open)
    with pytest.raises(OSError) as err:
        log_summary(tmp_path, {"trial": 2, "padding": "x" * 100})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "summary.jsonl")
    assert HalfThenFull.writes == 2
    assert (tmp_path / "summary.jsonl").read_bytes() == before == b'{"trial": 1}\n'


@pytest.mark.parametrize("engine_arg, says", [
    ("max_num_seqs=abc", "engine argument max_num_seqs must be an integer, got 'abc'"),
    ("bogus=1", "unknown engine argument(s) bogus: known are model, "),
    ("block_size=0", "engine argument block_size must be at least 1, got 0"),
    ("enable_prefix_caching=maybe", "engine argument enable_prefix_caching must be true or false, got 'maybe'"),
    ("model=[1", "engine argument 'model=[1': the value is not YAML ("),
    ("max_num_seqs", "engine argument 'max_num_seqs' is not KEY=VALUE"),
])
def test_bad_engine_argument_is_one_line_before_anything_is_written(small_reuse_trace, tmp_path, engine_arg, says):
    for command in (["engine", "run"], ["bench", "order"]):
        out = tmp_path / "-".join(command)
        line = one_error_line(invoke(*command, "--trace", small_reuse_trace, "--engine-arg", engine_arg, "--out", out))
        assert line.startswith("Error: ") and says in line
        assert not out.exists()


@pytest.mark.parametrize("text, says", [
    ("params:\n  fixed_s: fast\n", "simulator parameter fixed_s must be a number, got 'fast'"),
    ("- 1\n", "simulator parameters must be a mapping, got list"),
    ("params: {fixed_s: [1\n", "not YAML: "),
    ("a: 1\n", "unknown key(s) a: "),
])
def test_bad_simulator_parameters_are_one_line_before_anything_is_written(small_reuse_trace, tmp_path, text, says):
    params = tmp_path / "p.yaml"
    params.write_text(text)
    out = tmp_path / "out"
    for command in (["engine", "run", "--trace", small_reuse_trace, "--out", out],
                    ["bench", "order", "--trace", small_reuse_trace, "--out", out],
                    ["standalone", "sim-server", "--port", 1],
                    ["bench", "harvest", "--cluster", "standin", "--out", out / "h.json"]):  # before its cluster
        line = one_error_line(invoke(*command, "--sim-params", params))
        assert line == f"Error: {params}: {says}" or line.startswith(f"Error: {params}: {says}")
    assert not out.exists()


def out_of_range_cases(trace, dataset, tokenizer, out):
    mlperf = ["mlperf", "run", "--arm", "standalone", "--dataset", dataset, "--out", out]
    return [
        (["smoke-inputs", "--out", out, "--articles", 0], "--articles"),
        *[(["trace", "--corpus", dataset, "--tokenizer", tokenizer, "--name", "t", "--documents", 2, "--questions", 2,
            "--out", out, option, 0], option) for option in ("--documents", "--questions", "--prefix-tokens")],
        (["smoke-inputs", "--out", out, "--articles", 10, "--vocab-size", 100], "--vocab-size"),
        (["engine", "run", "--trace", trace, "--out", out, "--batch", -1], "--batch"),
        (["engine", "run", "--trace", trace, "--out", out, "--warmup-rounds", -1], "--warmup-rounds"),
        (["bench", "router", "--requests", 0], "--requests"),
        (["bench", "router", "--repeats", 10**9], "--repeats"),
        (["trace-mooncake", dataset, "--out", out, "--max-model-len", 10**23], "--max-model-len"),
        (["bench", "sim", "--trace", trace, "--repeats", 0], "--repeats"),
        (["bench", "codec", "--trace", trace, "--batch", 0], "--batch"),
        (["bench", "codec", "--trace", trace, "--repeats", 0], "--repeats"),
        (["bench", "order", "--trace", trace, "--out", out, "--shards", 0], "--shards"),
        (["bench", "order", "--trace", trace, "--out", out, "--shard", -1], "--shard"),
        (["bench", "order", "--trace", trace, "--out", out, "--repeats", 0], "--repeats"),
        (["standalone", "run", "--trace", trace, "--out", out, "--repeats", 0], "--repeats"),
        (["standalone", "sim-server", "--port", 99999], "--port"),
        (["flame", "run", "--trace", trace, "--out", out, "--batch-limit", 0], "--batch-limit"),
        (["flame", "run", "--trace", trace, "--out", out, "--window-ms", -1], "--window-ms"),
        (mlperf + ["--samples", 0], "--samples"),
        (mlperf + ["--max-tokens", 0], "--max-tokens"),
        (mlperf + ["--qps-margin", 0], "--qps-margin"),
        (mlperf + ["--target-qps", -1], "--target-qps"),
        (mlperf + ["--max-in-flight", 0], "--max-in-flight"),
        (mlperf + ["--probe-samples", 0], "--probe-samples"),
        (mlperf + ["--min-query-count", 0], "--min-query-count"),
        (["mlperf", "smoke-dataset", "--tokenizer", tokenizer, "--out", out / "d.json", "--samples", 0], "--samples"),
        (["mlperf", "random-dataset", "--out", out / "d.json", "--samples", -1], "--samples"),
    ]


def test_out_of_range_counts_are_usage_errors_and_write_nothing(tmp_path):
    trace, dataset, tokenizer, out = tmp_path / "t.json", tmp_path / "cnn_eval.json", tmp_path / "tok", tmp_path / "out"
    trace.write_text("{}")
    dataset.write_text("[]")
    tokenizer.mkdir()
    for args, option in out_of_range_cases(trace, dataset, tokenizer, out):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert f"Invalid value for '{option}'" in one_error_line(result), args
        assert not out.exists(), args


def test_a_shard_beyond_the_shards_is_one_line(small_reuse_trace, tmp_path):
    out = tmp_path / "out"
    line = one_error_line(invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 2, "--shard", 2,
                                 "--out", out))
    assert line == "Error: --shard 2: there are only shards 0 to 1 (--shards 2)"
    assert not out.exists()


def test_bench_commands_turn_a_bad_trace_into_one_line(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_bytes(b"\xff garbage")
    for command in (["bench", "sim"], ["bench", "codec"]):
        line = one_error_line(invoke(*command, "--trace", trace))
        assert line.startswith(f"Error: {trace}: not valid JSON")


def test_bench_codec_and_sim_say_their_runs_and_spread_write_json_and_a_batch_over_budget_says_what_to_change(
        small_reuse_trace, tmp_path):
    """Outside pass Q: both printed the best of N without saying so or the spread, had no --out, and a batch over
    Flame's payload budget did not say to give a smaller --batch."""
    from parity.bench import codec
    from parity.errors import ParityError

    for command, says in ((["bench", "codec"], "(times: the best of 3 runs on this machine, then the runs' range)"),
                          (["bench", "sim"], "best of 3 runs, ")):
        out = tmp_path / f"{command[1]}.json"
        result = invoke(*command, "--trace", small_reuse_trace, "--repeats", 3, "--out", out)
        assert result.exit_code == 0 and says in result.stdout, result.output
        assert json.loads(out.read_text())["repeats"] == 3
    with pytest.raises(ParityError, match=r"over the payload budget.*give a smaller --batch\)$"):
        codec.run(small_reuse_trace, budget=1000, repeats=1)


def test_order_json_is_written_whole(small_reuse_trace, tmp_path):
    out = tmp_path / "out"
    result = invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 2, "--shard", 0, "--repeats", 1,
                    "--warmup-rounds", 0, "--out", out)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "order.json").read_text())
    assert [r["shard"] for r in rows[0]["shards"]] == [0]
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".run.lock"]  # no temp file left


def test_a_rerun_of_bench_order_into_its_folder_leaves_no_earlier_runs_files_and_names_an_empty_shard(
        small_reuse_trace, tmp_path):
    """Outside pass Q: a rerun with fewer repeats and shards kept the first run's trials beside new shard traces of
    the same names (validate: sha256-mismatch); a shard the router sends nothing printed nothing at all."""
    out = tmp_path / "out"
    first = invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 3, "--repeats", 2, "--warmup-rounds", 0,
                   "--out", out)
    assert first.exit_code == 0, first.output
    again = invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 2, "--shard", 0, "--repeats", 1,
                   "--warmup-rounds", 0, "--out", out)
    assert again.exit_code == 0 and "removing an earlier run's" in again.output, again.output
    assert sorted(p.name for p in (out / "trials").iterdir()) == ["reuse-shard0-arrival-r0.json",
                                                                  "reuse-shard0-prefix-r0.json"]
    other = out / "trials" / "sim-0-shard1.json"  # another command's `-shard` file (offline-limit's): not order's
    other.write_text("{}")
    rerun = invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 2, "--shard", 0, "--repeats", 1,
                   "--warmup-rounds", 0, "--out", out)
    assert rerun.exit_code == 0 and other.exists(), rerun.output  # outside pass R: offline-limit's files went
    other.unlink()
    checked = invoke("validate", out)  # (its trace, a fixture's, lies outside the tree: those links are named)
    assert "reuse-shard0" in checked.output and "sha256-mismatch" not in checked.output, checked.output
    empty = invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 64, "--shard", 63, "--repeats", 1,
                   "--warmup-rounds", 0, "--out", tmp_path / "empty")
    assert empty.exit_code == 0 and "reuse shard 63: the sticky router sends it no request" in empty.output, \
        empty.output
    assert invoke("bench", "order", "--trace", small_reuse_trace, "--shards", 10**8, "--out", out).exit_code == 2


# ---- bad input refused at the door: before any engine starts, anything runs or is written -----------------

def one_line_only(result) -> str:
    """The `Error: ...` line of a command refused before it said anything else (no progress line first)."""
    line = one_error_line(result)
    assert result.output.strip().splitlines() == [line], result.output
    return line


def test_two_shards_on_one_gpu_are_refused_before_any_engine_starts(small_reuse_trace, tmp_path):
    out = tmp_path / "out"
    for command in (["standalone", "run"], ["flame", "run"]):
        line = one_line_only(invoke(*command, "--gpu", "sim-1", "--gpu", "sim-1", "--trace", small_reuse_trace,
                                    "--out", out))
        assert line == "Error: GPU sim-1 is given to 2 shards (sim-1, sim-1); each shard needs a GPU of its own"
    backend = json.dumps({"engine": "sim", "gpus": ["sim-0", "sim-0"]})
    line = one_line_only(invoke("experiment", "run", "confirmation", "--trace", small_reuse_trace, "--backend", backend,
                                "--settings", '{"pairs": 1}', "--out", out))
    assert line == "Error: GPU sim-0 is given to 2 shards (sim-0, sim-0); each shard needs a GPU of its own"
    assert not out.exists()


def test_a_gpu_this_machine_lacks_is_refused_before_any_warmup(small_reuse_trace, tmp_path, monkeypatch):
    from parity import gpus

    out = tmp_path / "out"
    line = one_line_only(invoke("standalone", "run", "--gpu", "sim-0", "--gpu", "GPU-fake", "--trace", small_reuse_trace,
                                "--out", out))
    assert line == "Error: GPU GPU-fake is not a simulated GPU: the simulator's are named sim-0, sim-1, ..."
    bin_dir = tmp_path / "bin"  # an nvidia-smi that lists one GPU and one MIG device, as `nvidia-smi -L` does
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1111)'\n"
                                        "echo '  MIG 1g.18gb     Device  0: (UUID: MIG-2222)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert gpus.on_this_machine() == ["GPU-1111", "MIG-2222"]
    gpus.check(["GPU-1111", "MIG-2222"], simulated=False)  # the machine's own: taken
    line = one_line_only(invoke("standalone", "run", "--replicas", "vllm", "--gpu", "GPU-fake",
                                "--trace", small_reuse_trace, "--out", out))
    assert line == "Error: GPU GPU-fake is not on this machine (nvidia-smi lists GPU-1111, MIG-2222)"
    assert not out.exists()


def test_bench_startup_looks_for_flame_binaries_before_the_standalone_runs(tmp_path, monkeypatch):
    """Outside pass Q: with no Flame binaries, `bench startup --cluster flame` ran every standalone start first (N
    cold vLLM starts on a GPU host) and only then said so."""
    monkeypatch.delenv("FLAME_BIN_DIR", raising=False)
    out = tmp_path / "o"
    assert one_line_only(invoke("bench", "startup", "--cluster", "flame", "--repeats", 1, "--out", out)).startswith(
        "Error: no Flame binaries: give --flame-bin-dir")
    assert not (out / "standalone-0").exists()


def test_bench_out_is_checked_before_the_benchmark_runs(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for command in (["bench", "routing", "--quick", "--family", "shards"], ["bench", "schedule", "--requests", 2]):
        assert one_line_only(invoke(*command, "--out", tmp_path)) == f"Error: {tmp_path}: is a folder, not a file"
        assert one_line_only(invoke(*command, "--out", afile / "r.json")) == \
            f"Error: {afile}: a part of this path is a file, not a folder"
    assert afile.read_text() == "not a folder"


def test_a_bench_reads_the_study_settings_from_the_workflow_config_it_is_given(tmp_path, monkeypatch):
    """`parity bench schedule`'s default rate is ten times the sustained ladder's top rung of the config it is
    given, merged as Snakemake merges a profile's file (config/host.yaml: reuse-640 up to 12 req/s, its bounded
    arm's own ladder up to 18); a config
    that is not a mapping, or whose setting the schema refuses, is one line naming it."""
    root = pathlib.Path(__file__).resolve().parents[1] / "config"
    merged = invoke("bench", "schedule", "--requests", 2, "--config", root / "experiments.yaml",
                    "--config", root / "host.yaml")
    assert merged.exit_code == 0 and merged.stdout.startswith("poisson at 180 requests/s"), merged.output
    (tmp_path / "list.yaml").write_text("- a\n")
    (tmp_path / "bad.yaml").write_text("experiments:\n  sustained: {rates: [-1]}\n")
    assert one_line_only(invoke("bench", "schedule", "--config", tmp_path / "list.yaml")) == \
        f"Error: {tmp_path / 'list.yaml'}: a workflow config is a mapping, got list"
    assert one_line_only(invoke("bench", "schedule", "--config", tmp_path / "bad.yaml")).startswith(
        "Error: sustained rates: [-1] is not valid")
    assert one_line_only(invoke("bench", "schedule", "--config", tmp_path / "gone.yaml")) == \
        f"Error: {tmp_path / 'gone.yaml'}: no such workflow config (run from the repository root, or name one with --config)"
    (tmp_path / "none.yaml").write_text("experiments: {}\n")
    assert one_line_only(invoke("bench", "startup", "--config", tmp_path / "none.yaml", "--out", tmp_path / "o")) == \
        f"Error: {tmp_path / 'none.yaml'}: no experiments.confirmation in this workflow config"
    monkeypatch.chdir(tmp_path)  # outside the repository: a given rate needs no config
    ran = invoke("bench", "schedule", "--rate", 240, "--requests", 2)
    assert ran.exit_code == 0 and ran.stdout.startswith("poisson at 240 requests/s"), ran.output


def test_a_missing_backend_file_is_named_as_missing_not_as_bad_json(small_reuse_trace, tmp_path):
    missing = tmp_path / "backend.yaml"
    for command in (["experiment", "run", "gc"], ["engine", "run"]):
        line = one_line_only(invoke(*command, "--trace", small_reuse_trace, "--backend", missing,
                                    "--out", tmp_path / "out"))
        assert line == f"Error: backend: {missing}: no such file (give a JSON or YAML file, or a JSON object)"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, says", [
    ("engine: sim\ngpus: [a\n", "expected ',' or ']', but got '<stream end>' at line 3, column 1 (while parsing a "
                                "flow sequence at line 2, column 7)"),
    ("engine: sim\n\tgpus: [a]\n", "found character '\\t' that cannot start any token at line 2, column 1 (while "
                                   "scanning for the next token)"),
    ('{"engine": "sim"}\n{"gpus": ["sim-0"]}\n', "expected '<document start>', but found '{' at line 2, column 1"),
    ("[" * 100_000, "nested more deeply than Python's YAML parser reads"),
], ids=["flow-sequence", "tab", "jsonl", "deep"])
def test_a_malformed_backend_or_workflow_config_file_is_one_line(small_reuse_trace, tmp_path, text, says):
    """An outside tester's: a malformed --backend YAML file gave PyYAML's message whole, six lines with the source
    quoted and a caret (a workflow config given to --config the same); now what it found and where, on one line."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = one_line_only(invoke("experiment", "run", "offline-limit", "--trace", small_reuse_trace, "--backend", bad,
                                "--out", tmp_path / "out"))
    assert line == f"Error: backend: {bad}: neither JSON nor a readable YAML file ({says})"
    assert one_line_only(invoke("bench", "schedule", "--config", bad)) == \
        f"Error: {bad}: not a readable workflow config ({says})"
    assert not (tmp_path / "out").exists()


def test_a_results_folder_with_no_experiment_is_named_as_such(tmp_path):
    """An outside evaluator's (2026-12-05): `parity report --results EMPTY` was told to give --results."""
    (tmp_path / "empty").mkdir()
    assert one_error_line(invoke("report", "--results", tmp_path / "empty", "--out", tmp_path / "r")) == \
        f"Error: {tmp_path / 'empty'}: no experiment in it (no {tmp_path / 'empty'}/*/experiment.json): give the " \
        "folder a run wrote, or --experiment DIR or --mlperf DIR"
    assert not (tmp_path / "r").exists()


def test_what_an_outside_evaluator_met_on_a_second_pass_is_one_line_naming_the_cause(small_inputs, small_reuse_trace,
                                                                                     tmp_path):
    """2026-12-05: a missing .pub file was called "not a minisign public key (invalid base64)", a corpus folder
    "not found", a past --deadline left empty folders, and seal sealed a folder holding nothing."""
    _, tokenizer = small_inputs
    (tmp_path / "empty").mkdir()
    cases = [
        (["validate", tmp_path / "empty", "--public-key", tmp_path / "nope.pub"], 1, "no public key file at"),
        (["trace", "--corpus", tmp_path, "--tokenizer", tokenizer, "--name", "t", "--documents", 2, "--questions", 2,
          "--out", tmp_path / "out"], 1, "is a folder: give its JSONL file"),
        (["experiment", "run", "confirmation", "--trace", small_reuse_trace, "--backend", '{"engine": "sim"}',
          "--deadline", -5, "--out", tmp_path / "out"], 2, "is already past"),
        (["seal", tmp_path / "empty"], 1, "nothing to seal in"),
    ]
    for args, code, says in cases:
        result = invoke(*args)
        assert result.exit_code == code and says in one_error_line(result), (args, result.output)
    assert not (tmp_path / "out").exists() and not (tmp_path / "empty" / "run.json").exists()


def test_bench_schedule_refuses_a_rate_no_rung_could_take_and_a_negative_seed(tmp_path):
    """An outside tester's --rate 1e-300 hung (a schedule of 1e296 hours), and --seed -1 was numpy's traceback."""
    slow = invoke("bench", "schedule", "--rate", "1e-300", "--requests", 2)
    assert one_line_only(slow).endswith("longer than the 1 h a rung may take; raise the rate")
    negative = invoke("bench", "schedule", "--seed", -1, "--rate", 10, "--requests", 3)
    assert negative.exit_code == 2 and "Invalid value for '--seed'" in negative.output


def test_bench_schedule_refuses_a_degenerate_gamma_saves_strict_json_first_and_says_a_closed_stdout(tmp_path):
    """Outside pass Q: `--burstiness 1e-300` wrote NaN and Infinity into --out (not JSON) and said "meets"; with
    stdout closed (`| true`) the command exited 1 silently and, printing before it saved, lost its --out."""
    import subprocess
    import sys

    tiny = invoke("bench", "schedule", "--kind", "gamma", "--burstiness", "1e-300", "--rate", 100, "--requests", 10)
    assert tiny.exit_code == 2 and "x>=0.01" in tiny.output
    out = tmp_path / "s.json"
    run = subprocess.run(f"{sys.executable} -m parity bench schedule --rate 200 --requests 8 --out {out} | true",
                         shell=True, capture_output=True, text=True, timeout=120,
                         executable="/bin/bash", env=os.environ | {"PYTHONPATH": str(pathlib.Path(__file__).parents[1] / "src")})
    assert "stdout was closed" in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert json.loads(out.read_text())["requests"] == 8
    from parity.cli.bench import save
    from parity.errors import ParityError

    with pytest.raises(ParityError, match="not finite"):
        save(tmp_path / "nan.json", {"gap_cv": float("nan")})
    assert not (tmp_path / "nan.json").exists()


@pytest.mark.parametrize("name", ["a\nb.json", "a\rb.json", "tab\there.json"])
def test_an_out_with_a_control_character_is_one_line_and_nothing_written(tmp_path, name):
    """An outside tester's: `--out $'a\\nb.json'` wrote a file whose name split each line-based record naming it."""
    out = tmp_path / name
    result = invoke("mlperf", "random-dataset", "--samples", 2, "--out", out)
    line = one_error_line(result)
    assert "holds a control character (a newline?)" in line and result.exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_a_read_that_fails_on_the_device_is_one_line(tmp_path, monkeypatch):
    """`bench routing --trace-file /proc/self/mem` printed a 37-line traceback (EIO): a failing disk or network
    file system is the user's environment, as a full one is (an outside tester's, 2026-12-06)."""
    from parity import trace_mooncake

    def failing(*args, **kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(tmp_path / "t.jsonl"))

    (tmp_path / "t.jsonl").write_text("{}\n")
    monkeypatch.setattr(trace_mooncake, "utf8_line", failing)
    line = one_error_line(invoke("bench", "routing", "--trace-file", tmp_path / "t.jsonl"))
    assert line == f"Error: {tmp_path / 't.jsonl'}: input/output error (a failing disk or network file system)"


def test_a_bench_out_that_is_its_own_input_is_refused_and_the_input_kept(tmp_path):
    """`bench routing --out` over its --trace-file, `bench schedule --out` over its --config: the input was replaced
    by the result (an outsider's, 2026-12-07); refused before any work, as `trace` and `fetch` refuse it."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}) + "\n")
    config = tmp_path / "experiments.yaml"
    config.write_text("experiments: {}\n")
    for args, given in ((["bench", "routing", "--trace-file", trace, "--out", trace], trace),
                        (["bench", "schedule", "--requests", 10, "--rate", 5, "--config", config, "--out", config],
                         config)):
        before = given.read_bytes()
        line = one_error_line(invoke(*args))
        assert f"is the command's input" in line and str(given) in line
        assert given.read_bytes() == before


@pytest.mark.parametrize("kind", ["link", "device"])
def test_an_out_file_that_is_a_link_or_a_device_is_refused_not_replaced(tmp_path, kind):
    """The result was written beside the --out and renamed over it: a link to /dev/stdout, or a device, became a
    plain file (an outsider's, 2026-12-07)."""
    out = tmp_path / "out.json"
    if kind == "link":
        out.symlink_to(tmp_path / "elsewhere.json")
    else:
        os.mkfifo(out)  # a file that is not a regular one, made without root
    line = one_error_line(invoke("bench", "admission", "--requests", 4, "--repeats", 1, "--out", out))
    assert line == (f"Error: {out}: {'a link' if kind == 'link' else 'not a regular file'}, "
                    "which the command would replace by a file: give the path of a file, or of none yet")
    assert out.is_symlink() if kind == "link" else not out.is_file()


def test_a_loop_of_links_as_an_out_or_input_is_one_line(tmp_path):
    """Path.resolve raised RuntimeError on a loop (Python 3.11): a traceback from the --out check (an outsider's)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}) + "\n")
    line = one_error_line(invoke("trace-mooncake", trace, "--out", tmp_path / "out", "--tokenizer", tmp_path / "a"))
    assert "too many levels of symbolic links" in line and str(tmp_path / "a") in line


def test_a_backend_or_simulator_file_that_is_a_loop_of_links_is_named_as_one_not_as_missing(tmp_path):
    """`--backend LOOP` said "no such file" and `--sim-params LOOP` "not found" (an outsider's, 2026-12-07)."""
    from parity.backend import Backend
    from parity.engine.sim import SimParams
    from parity.errors import ParityError

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = tmp_path / "a"
    with pytest.raises(ParityError, match="a link to nothing"):
        Backend.parse(str(loop))
    with pytest.raises(ParityError, match="a link to nothing"):
        SimParams.load(loop)


def test_bench_order_refuses_an_out_holding_its_trace_and_two_traces_of_one_name(small_reuse_trace, tmp_path):
    """`bench order --out` the trace's own folder wrote its order.json over a trace named `order`, and two traces of
    one name wrote the second's shard files and trials over the first's (an outsider's, 2026-12-07): both are refused
    before anything is written."""
    import shutil

    folder = small_reuse_trace.parent
    before = sorted(folder.iterdir())
    line = one_error_line(invoke("bench", "order", "--trace", small_reuse_trace, "--repeats", 1, "--out", folder))
    assert line.startswith(f"Error: --out {folder} ") and "--trace" in line, line
    assert sorted(folder.iterdir()) == before
    twin = tmp_path / "twin"
    shutil.copytree(folder, twin)
    out = tmp_path / "out"
    line = one_error_line(invoke("bench", "order", "--trace", small_reuse_trace, "--trace", twin / small_reuse_trace.name,
                                 "--repeats", 1, "--out", out))
    assert f"named 'reuse', as --trace {small_reuse_trace} is" in line, line
    assert not out.exists() or not any(out.iterdir())


def test_sigterm_leaves_no_part_of_a_trace(tmp_path):
    """A SIGTERM while `trace-mooncake` wrote its files left the new tokens beside the old manifest, or tokens with no
    manifest (an outsider's, 2026-12-07): every command now leaves through its context managers on SIGTERM, so
    `all_or_nothing` removes what it wrote, and exits 143. The signal is sent by the command itself, at its manifest."""
    import signal
    import subprocess
    import sys

    source = tmp_path / "t.jsonl"
    source.write_text(mooncake_line())
    out = tmp_path / "out"
    script = ("import os, signal, sys, time\n"
              "import parity.trace_mooncake as m\n"
              "def stop(*a, **k):\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    time.sleep(30)\n"
              "m.write_manifest = stop\n"
              "from parity.cli import main\n"
              f"sys.argv = ['parity', 'trace-mooncake', {str(source)!r}, '--out', {str(out)!r}]\n"
              "main()\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and (not out.exists() or not any(out.iterdir())), sorted(out.iterdir())
    # it started no process, so it says it leaves in order, not that it stops processes it never started
    assert "parity: SIGTERM: leaving in order" in run.stderr and "processes" not in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("extra, says", [
    (["--warmup-rounds", 5], "has no variant 'warmup5'"),
    (["--engine-arg", "max_model_len=10"], "does not fit the engine's max_model_len 10"),
])
def test_bench_order_refuses_what_its_trials_would_before_it_writes(small_reuse_trace, tmp_path, extra, says):
    """More warm-up rounds than the trace has variants, or a trace the engine's context cannot hold, were refused
    only after the shards' traces (and warm-ups) were written into --out (an outsider's, 2026-12-07)."""
    out = tmp_path / "out"
    line = one_error_line(invoke("bench", "order", "--trace", small_reuse_trace, "--repeats", 1, "--out", out, *extra))
    assert says in line, line
    assert not out.exists() or not any(out.iterdir())


def test_a_report_into_an_experiment_under_results_names_that_experiment(tmp_path):
    """`report --results R --out R/E/x` said --out "is the command's input --results R/E", a path not given as
    --results (an outsider's, 2026-12-07): the folder is named as an experiment --results holds."""
    experiment = tmp_path / "results" / "locality"
    experiment.mkdir(parents=True)
    (experiment / "experiment.json").write_text("{}")
    out = experiment / "report"
    line = one_error_line(invoke("report", "--results", tmp_path / "results", "--out", out))
    assert line.startswith(f"Error: --out {out} lies in the command's input (an experiment --results "
                           f"{tmp_path / 'results'} holds) {experiment}"), line
    assert not out.exists()


def test_a_service_its_manager_stops_dies_at_once_on_sigterm(monkeypatch):
    """Every command leaves through its context managers on SIGTERM, but a Flame worker and a simulator replica die
    at once as before (their managers' teardowns clean up; a teardown inside a server's wait would hold them up)."""
    import signal

    import parity.flame.service
    import parity.standalone.sim_server

    seen = []
    monkeypatch.setattr(parity.flame.service, "main", lambda: seen.append(signal.getsignal(signal.SIGTERM)))
    monkeypatch.setattr(parity.standalone.sim_server, "serve",
                        lambda *a, **k: seen.append(signal.getsignal(signal.SIGTERM)))
    assert invoke("flame", "worker").exit_code == 0
    assert invoke("standalone", "sim-server", "--port", 1).exit_code == 0
    assert seen == [signal.SIG_DFL, signal.SIG_DFL]


def test_a_trace_the_engine_cannot_hold_is_refused_before_any_engine_starts(small_reuse_trace, tmp_path):
    """`engine run`, `standalone run` and `flame run` started their engines and warmed them up before a prompt that,
    with its new tokens, outgrew max_model_len failed, and said "a prompt of 251 tokens exceeds max_model_len 260"
    (an outsider's, 2026-12-07): each refuses first, naming the request and the new tokens."""
    for command in (["engine", "run"], ["standalone", "run"], ["flame", "run"]):
        out = tmp_path / "-".join(command)
        line = one_error_line(invoke(*command, "--trace", small_reuse_trace, "--engine-arg", "max_model_len=1000",
                                     "--out", out))
        assert " prompt tokens; with 16 new tokens it does not fit the engine's max_model_len 1000" in line, line
        assert not out.exists()


@pytest.mark.parametrize("command", [["engine", "run"], ["standalone", "run"], ["flame", "run"]])
def test_more_warmup_rounds_than_variants_is_refused_before_any_engine_starts(small_reuse_trace, tmp_path, command):
    """`engine run --warmup-rounds 3` started its engine and ran two warm-ups before refusing (an outsider's,
    2026-12-07); each run command refuses it first now, writing nothing."""
    out = tmp_path / "out"
    line = one_error_line(invoke(*command, "--trace", small_reuse_trace, "--warmup-rounds", 3, "--out", out))
    assert "has no variant 'warmup3'; it has measured, warmup1, warmup2" in line, line
    assert not out.exists() or not any(out.iterdir())


def test_a_file_size_limit_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """`ulimit -f 8` gave a traceback (OSError: [Errno 27] File too large; an outsider's, 2026-12-07): EFBIG is one
    of the environment's errors, said in one line with its file."""
    from parity import smoke_inputs

    out = tmp_path / "out"

    def too_large(corpus, tokenizer_dir, vocab_size):
        tokenizer_dir.mkdir(parents=True)
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(tokenizer_dir / "tokenizer.json"))

    monkeypatch.setattr(smoke_inputs, "train_tokenizer", too_large)
    line = one_error_line(invoke("smoke-inputs", "--out", out, "--articles", 2))
    assert line == (f"Error: {out / 'tokenizer' / 'tokenizer.json'}: file too large (a file-size limit: ulimit -f, "
                    "or the file system's largest file)")


def test_a_full_disk_at_the_run_lock_names_the_lock_file(tmp_path, monkeypatch):
    """A completely full disk said only "no space left on the device" (os.pwrite names no file; an outsider's)."""
    from parity import run_lock

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(run_lock.os, "pwrite", full)
    with pytest.raises(OSError) as error:
        with run_lock.holding(tmp_path / "out"):
            pass
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "out" / ".run.lock")


def test_ctrl_c_exits_130_also_at_a_prompt_and_an_end_of_input_stays_clicks():
    """Ctrl-C exits 128 + SIGINT with one line, not Click's "Aborted!" and 1; at a prompt (`parity sign`'s password)
    it reaches the group as Click's Abort, which still said "Aborted!" (outside pass N). Ctrl-D there stays Click's."""
    from parity.cli.app import Group

    @click.group(cls=Group)
    def group():
        pass

    @group.command()
    def interrupted():
        raise KeyboardInterrupt

    @group.command()
    def prompted():  # what click.prompt does with Ctrl-C, and with the end of input
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise click.Abort() from None

    @group.command()
    def ended():
        try:
            raise EOFError
        except EOFError:
            raise click.Abort() from None

    for name in ("interrupted", "prompted"):
        result = CliRunner().invoke(group, [name])
        assert result.exit_code == 130 and "Aborted!" not in result.output, (name, result.output)
        assert "parity: SIGINT: stopped" in result.output
    result = CliRunner().invoke(group, ["ended"])
    assert result.exit_code == 1 and "Aborted!" in result.output
