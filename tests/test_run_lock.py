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


@pytest.mark.parametrize("inner", [True, False], ids=["inside-a-held-folder", "around-a-held-folder"])
def test_a_folder_inside_or_around_one_another_run_holds_is_refused(tmp_path, inner):
    """The lock guarded its own folder alone: `standalone run --out R/loc/trials` wrote its trial over the running
    experiment's in R/loc, whose manifest then linked it (an outsider's, 2026-12-07). A folder within or around one a
    live run of another process holds is refused; this process's own (and its parents') are not another run."""
    held = tmp_path / "R" / "loc" if inner else tmp_path / "R" / "loc" / "trials"
    asked = tmp_path / "R" / "loc" / "trials" if inner else tmp_path / "R" / "loc"
    code = (f"from parity import run_lock; import sys\nwith run_lock.holding({str(held)!r}):\n"
            "    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ParityError) as error:
            with run_lock.holding(asked):
                pass
        where = f"lies inside {held}" if inner else f"holds {held}"
        assert str(error.value) == (f"{asked}: {where}, which another parity run (pid {holder.pid}) is writing into: "
                                    "wait for it to end, or give another --out")
    finally:
        holder.communicate("", timeout=60)
    with run_lock.holding(asked):  # the holder has ended: free
        pass
    with run_lock.holding(held), run_lock.holding(asked):  # one process may hold both (its own run's folders)
        pass
