"""One run per output folder (parity.run_lock): a second run into a folder another is writing is refused in one
line naming the first, and a dead holder's lock is no lock (an outsider's, 2026-12-07: two `experiment run`s into
one --out each rewrote the other's trials and both exited 0)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from parity import run_lock
from parity.cli import main
from parity.errors import ParityError
from parity.seal import kept


def test_a_second_holder_is_refused_naming_the_first_and_the_folder_is_free_after(tmp_path):
    out = tmp_path / "out"
    with run_lock.holding(out):
        with pytest.raises(ParityError) as error:
            with run_lock.holding(out):
                pass
        assert str(error.value) == (f"{out}: another parity run (pid {os.getpid()}) is writing into this folder: "
                                    "wait for it to end, or give another --out")
    with run_lock.holding(out):  # released
        pass
    assert kept(out) == []  # the lock file is no evidence


def test_a_killed_holders_lock_is_taken_over(tmp_path):
    out = tmp_path / "out"
    code = f"from parity import run_lock; import os\nwith run_lock.holding({str(out)!r}): os._exit(0)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # dies holding it: the kernel drops it
    with run_lock.holding(out):
        pass


@pytest.mark.parametrize("command", [["experiment", "run", "offline-limit", "--backend", '{"engine": "sim"}'],
                                     ["standalone", "run"],
                                     ["flame", "run"]])
def test_a_run_into_a_folder_another_run_holds_is_refused_in_one_line_writing_nothing(tmp_path, small_reuse_trace,
                                                                                        command):
    out = tmp_path / "out"
    with run_lock.holding(out):
        before = sorted(p.name for p in out.iterdir())
        result = CliRunner().invoke(main, [*command, "--trace", str(small_reuse_trace), "--out", str(out)])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.output.strip().splitlines()[-1] == (
            f"Error: {out}: another parity run (pid {os.getpid()}) is writing into this folder: wait for it to end, "
            "or give another --out")
        assert sorted(p.name for p in out.iterdir()) == before
