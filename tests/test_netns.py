"""parity.netns: the job re-executed in a network namespace with only loopback, or a stated reason why not.

The real-Flame test needs FLAME_BIN_DIR (the v0.6.0 binaries, built by hand outside the repo) and
`ss`; it checks from this (the host's) namespace that nothing listens on the cluster's ports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from parity import netns, procs
from parity.errors import ParityError
from parity.manifest import read_manifest
from real_flame import real_flame  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[1]
CAN_CONTAIN = netns._unshare_flags()[1] is None


@pytest.fixture(scope="module")
def trace(small_reuse_trace):
    return small_reuse_trace


def parity(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "parity", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_modes_and_in_process_calls(monkeypatch):
    monkeypatch.delenv(netns.INSIDE_ENV, raising=False)
    monkeypatch.setenv(netns.NONE_ENV, "as before")  # contain() sets it; restored after the test
    with pytest.raises(ParityError, match="network mode 'open': use one of auto, netns, host"):
        netns.contain("open", needed=True)
    assert netns.contain("host", needed=True) == "none: network mode host"
    assert netns.contain("auto", needed=False).startswith("none: not needed")
    lines = []
    assert netns.contain("auto", needed=True, log=lines.append) == \
        "none: the command was called in-process, so it cannot re-execute itself"  # pytest is not `parity`
    assert lines and lines[0].startswith("warning: Flame's ports will be open on every interface")
    with pytest.raises(ParityError, match="^network mode netns: cannot contain this run"):
        netns.contain("netns", needed=True)
    assert netns.record("flame-v0.6.0", 7000)["binds"] == ["0.0.0.0:7000", "0.0.0.0:7001"]


def test_a_backend_names_its_network_mode():
    from parity.backend import Backend

    assert Backend.from_dict({}).network == "auto"
    with pytest.raises(ParityError, match="backend network: 'wide' is not one of"):
        Backend.from_dict({"network": "wide"})


def test_the_stand_in_run_contained_on_request(trace, tmp_path):
    done = parity("flame", "run", "--trace", str(trace), "--warmup-rounds", "0", "--placement", "sticky",
                  "--network", "netns", "--out", str(tmp_path))
    if not CAN_CONTAIN:
        assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith(
            "Error: network mode netns: cannot contain this run in a network namespace: ")
        return
    assert done.returncode == 0, done.stderr
    doc = read_manifest(tmp_path / "locality-flame-sticky-reuse-r0.json")
    assert doc["network"]["containment"] == "netns" and doc["network"]["interfaces"] == ["lo"]
    assert doc["network"]["binds"][0].startswith("127.0.0.1:") and doc["flame_binaries"] is None


def test_the_stand_in_run_is_not_contained_by_default(trace, tmp_path):
    done = parity("flame", "run", "--trace", str(trace), "--warmup-rounds", "0", "--placement", "sticky",
                  "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    network = read_manifest(tmp_path / "locality-flame-sticky-reuse-r0.json")["network"]
    assert network["containment"].startswith("none: not needed")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@real_flame
@pytest.mark.skipif(shutil.which("ss") is None or not CAN_CONTAIN, reason="needs ss and unshare --net")
def test_real_flame_in_a_network_namespace_listens_on_nothing_outside_it(trace, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "parity", "flame", "run", "--cluster", "flame",
                             "--trace", str(trace), "--placement", "sticky", "--repeats", "2", "--warmup-rounds", "1", "--out", str(out)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "flame" / "flame-cluster.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        port = int(yaml.safe_load((out / "flame" / "flame-cluster.yaml").read_text())["cluster"]["endpoint"]
                   .rsplit(":", 1)[1])
        inside = []
        while not inside and time.monotonic() < deadline:  # the session manager, listening in its namespace
            sm = [pid for pid in procs.proc_table() if "flame-session-manager" in cmdline(pid)
                  and str(out) in cmdline(pid)]
            inside = sm and subprocess.run(["nsenter", f"--net=/proc/{sm[0]}/ns/net", "ss", "-ltnH",
                                            f"( sport = :{port} or sport = :{port + 1} )"],
                                           capture_output=True, text=True).stdout.split()
            time.sleep(0.2)
        assert f"0.0.0.0:{port}" in inside and f"0.0.0.0:{port + 1}" in inside
        outside = subprocess.run(["ss", "-ltnH", f"( sport = :{port} or sport = :{port + 1} )"],
                                 capture_output=True, text=True, check=True).stdout
        assert outside.strip() == "" and procs.listeners(port) == []
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, output
    assert "whatever the endpoint says; containment: netns" in output
    doc = read_manifest(out / "locality-flame-sticky-reuse-r0.json")
    assert doc["network"] == {"binds": [f"0.0.0.0:{port}", f"0.0.0.0:{port + 1}"], "containment": "netns",
                              "interfaces": ["lo"], "what": doc["network"]["what"]}
    binaries = doc["flame_binaries"]
    assert {b["version"] for b in binaries.values()} == {"flame-session-manager 0.6.0", "flame-executor-manager 0.6.0"}
    from parity.manifest import sha256_file

    assert all(b["sha256"] == sha256_file(b["path"]) for b in binaries.values())
    assert json.loads(json.dumps(read_manifest(out / "cleanup-flame.json")))["clean"]
