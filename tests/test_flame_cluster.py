"""The local Flame cluster launcher: config, binaries, ports and cleanup offline; a real cluster when one is built.

The integration test needs FLAME_BIN_DIR pointing at a directory with the v0.6.0 binaries
`flame-session-manager` and `flame-executor-manager` (built by hand outside the repo).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from parity import procs
from parity.errors import ParityError
from parity.flame import cluster as fc
from parity.manifest import validate_document
from real_flame import bin_dir as real_bin_dir, real_flame  # tests/ is on sys.path

ECHO = Path(__file__).with_name("flame_cluster_echo.py")


# ---- config ------------------------------------------------------------------------------------

def test_config_keys_match_flame_v060(tmp_path):
    doc = fc.cluster_config(port=18080, socket_dir=tmp_path)
    assert set(doc) == {"cluster"}  # no cache section: the task API does not use the object cache
    c = doc["cluster"]
    assert c["name"] == "parity"
    assert c["endpoint"] == "http://127.0.0.1:18080"
    assert c["policies"] == ["priority", "drf", "gang"]
    assert c["storage"] == "none"
    assert c["executors"] == {"shim": "host"}
    assert "schedule_interval" not in c
    assert fc.cluster_config(port=1, socket_dir=tmp_path, schedule_interval_ms=10)["cluster"]["schedule_interval"] == 10


def test_config_file_round_trips_through_yaml(tmp_path):
    path = fc.write_cluster_config(tmp_path / "flame-cluster.yaml", port=20000, socket_dir="/tmp/flm-x",
                                   name="t", schedule_interval_ms=50)
    text = path.read_text()
    assert text.startswith("#") and "FLAME_SOCKET_DIR=/tmp/flm-x" in text
    loaded = yaml.safe_load(text)
    assert loaded == fc.cluster_config(port=20000, socket_dir="/tmp/flm-x", name="t", schedule_interval_ms=50)
    assert loaded["cluster"]["storage"] == "none"  # a string, not YAML null


def test_config_refuses_long_or_relative_socket_dir_and_missing_gang():
    long_dir = "/tmp/" + "d" * 70
    assert fc.socket_path_len(long_dir) >= fc.UNIX_PATH_MAX
    with pytest.raises(ParityError, match="too long"):
        fc.cluster_config(port=18080, socket_dir=long_dir)
    with pytest.raises(ParityError, match="absolute"):
        fc.cluster_config(port=18080, socket_dir="sockets")
    with pytest.raises(ParityError, match="gang"):
        fc.cluster_config(port=18080, socket_dir="/tmp/s", policies=("priority", "drf"))
    with pytest.raises(ParityError, match="port"):
        fc.cluster_config(port=65535, socket_dir="/tmp/s")


def test_short_socket_dir_fits_a_uuid_socket():
    assert fc.socket_path_len("/tmp/flm-abc123") == len("/tmp/flm-abc123/") + 36 + len(".sock")
    fc.check_socket_dir("/tmp/flm-abc123")


# ---- binaries and ports ------------------------------------------------------------------------

def fake_bin_dir(path: Path, scripts: dict[str, str], version: str = fc.VERSION) -> Path:
    """Shell scripts standing in for the binaries; each answers `--version` as clap does."""
    path.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        answer = f'if [ "$1" = --version ]; then echo "{name} {version}"; exit 0; fi\n'
        (path / name).write_text(body.replace("#!/bin/sh\n", "#!/bin/sh\n" + answer, 1))
        (path / name).chmod(0o755)
    return path


def test_find_binaries_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("FLAME_BIN_DIR", raising=False)
    with pytest.raises(ParityError, match="FLAME_BIN_DIR"):
        fc.find_binaries()
    with pytest.raises(ParityError, match="does not exist"):
        fc.find_binaries(tmp_path / "nope")
    only_sm = fake_bin_dir(tmp_path / "a", {fc.SESSION_MANAGER: "#!/bin/sh\n"})
    with pytest.raises(ParityError, match=fc.EXECUTOR_MANAGER) as err:
        fc.find_binaries(only_sm)
    assert fc.SESSION_MANAGER not in str(err.value).split("lacks")[1]
    (only_sm / fc.EXECUTOR_MANAGER).write_text("not executable")
    with pytest.raises(ParityError, match="not an executable"):
        fc.find_binaries(only_sm)


def test_an_empty_bin_dir_names_no_folder(monkeypatch):
    for empty in ("", " "):  # Path("") is ".": it read as the current folder, which the user did not name
        with pytest.raises(ParityError, match="^the Flame bin dir is empty"):
            fc.find_binaries(empty)
        monkeypatch.setenv("FLAME_BIN_DIR", empty)
        with pytest.raises(ParityError, match="^FLAME_BIN_DIR is empty"):  # named as where it came from
            fc.find_binaries()


def test_find_binaries_from_argument_or_env(tmp_path, monkeypatch):
    both = fake_bin_dir(tmp_path / "bin", {name: "#!/bin/sh\n" for name in fc.BINARIES})
    assert set(fc.find_binaries(both)) == set(fc.BINARIES)
    monkeypatch.setenv("FLAME_BIN_DIR", str(both))
    assert fc.find_binaries()[fc.SESSION_MANAGER] == (both / fc.SESSION_MANAGER).resolve()


def test_binaries_that_are_not_v060_are_refused_in_one_line(tmp_path):
    old = fake_bin_dir(tmp_path / "old", {name: "#!/bin/sh\nsleep 60\n" for name in fc.BINARIES}, version="0.5.0")
    with pytest.raises(ParityError, match=r"^\S+/flame-session-manager is not Flame v0.6.0: `--version` says "
                                          r"'flame-session-manager 0.5.0' \(exit 0\), parity needs "
                                          r"flame-session-manager 0.6.0$"):
        fc.FlameCluster(old, tmp_path / "w1").start()
    mute = fake_bin_dir(tmp_path / "mute", {name: "#!/bin/sh\nexit 2\n" for name in fc.BINARIES})
    for name in fc.BINARIES:  # no version answer at all
        (mute / name).write_text("#!/bin/sh\necho 'error: unexpected argument' >&2\nexit 2\n")
    with pytest.raises(ParityError, match="'error: unexpected argument' \\(exit 2\\)"):
        fc.FlameCluster(mute, tmp_path / "w2").start()
    assert not list((tmp_path / "w1").glob("flame-cluster.yaml"))  # refused before anything started


def test_nothing_says_flame_starts_before_its_binaries_said_they_are_v060(tmp_path):
    """"starting Flame v0.6.0 ..." came above the refusal of binaries that were not (outside pass I's nit)."""
    said = []
    old = fake_bin_dir(tmp_path / "old", {name: "#!/bin/sh\nsleep 60\n" for name in fc.BINARIES}, version="0.5.0")
    with pytest.raises(ParityError, match="is not Flame v0.6.0"):
        fc.FlameCluster(old, tmp_path / "w", log=said.append).start()
    assert not [line for line in said if "starting" in line], said


def test_version_and_sha256_are_recorded(tmp_path):
    bins = fake_bin_dir(tmp_path / "bin", {name: "#!/bin/sh\nsleep 60\n" for name in fc.BINARIES})
    from parity.manifest import sha256_file

    recorded = fc.check_version(fc.SESSION_MANAGER, bins / fc.SESSION_MANAGER, tmp_path)
    assert recorded == {"path": str(bins / fc.SESSION_MANAGER), "version": "flame-session-manager 0.6.0",
                        "sha256": sha256_file(bins / fc.SESSION_MANAGER)}


def test_pick_port_pair_gives_two_free_adjacent_ports():
    port = procs.free_port_pair()
    for p in (port, port + 1):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("0.0.0.0", p))


@contextlib.contextmanager
def _busy_port_after_a_free_one():
    """A port this process listens on whose predecessor is free (the cluster is asked for that pair), so
    another process on the machine holding the predecessor cannot make the test fail."""
    for _ in range(100):
        busy = socket.socket()
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        if fc.procs.port_free(port - 1, "0.0.0.0"):
            with busy:
                yield busy, port
            return
        busy.close()
    pytest.fail("no listening port with a free predecessor in 100 tries")


def test_busy_port_is_refused_before_starting(tmp_path):
    bins = fake_bin_dir(tmp_path / "bin", {name: "#!/bin/sh\nsleep 60\n" for name in fc.BINARIES})
    with _busy_port_after_a_free_one() as (busy, port):
        with pytest.raises(ParityError, match=rf"^port {port} on 0.0.0.0 is in use by pid {os.getpid()} "
                                              rf"\(.*\) on 0.0.0.0; Flame's session manager .* needs it$"):
            fc.FlameCluster(bins, tmp_path / "w", port=port - 1).start()


@pytest.mark.parametrize("says, quoted", [
    ("echo 'Address already in use'", r" \(Address already in use\)"),
    # its bind error above a later line on something else: the bind line is quoted (outside pass I's nit: the
    # message quoted the log's last line, which was not about the port)
    ("echo 'error: bind 0.0.0.0: Address already in use (os error 98)'\necho 'storage opened'",
     r" \(error: bind 0.0.0.0: Address already in use \(os error 98\)\)"),
    ("echo 'storage opened'", ""),  # nothing on the port in its log: no line about something else
])
def test_a_port_taken_between_pick_and_bind_is_one_line(tmp_path, monkeypatch, says, quoted):
    bins = fake_bin_dir(tmp_path / "bin", {fc.SESSION_MANAGER: f"#!/bin/sh\n{says}\nexit 1\n",
                                           fc.EXECUTOR_MANAGER: "#!/bin/sh\nexit 0\n"})
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setattr(fc.procs, "free_port_pair", lambda host="0.0.0.0": port)
        with pytest.raises(ParityError, match=rf"^Flame cluster at http://127.0.0.1:{port}: flame-session-manager "
                                              rf"\(pid \d+\) could not bind port {port}: pid {os.getpid()} \(.*\) "
                                              rf"on 0.0.0.0 took it after it was picked{quoted}; log: .*fsm.out$"):
            fc.FlameCluster(bins, tmp_path / "w", startup_timeout_s=10).start()


# ---- startup failures and cleanup, with fake binaries ------------------------------------------

def test_crashing_session_manager_gives_log_tail_and_clean_receipt(tmp_path):
    bins = fake_bin_dir(tmp_path / "bin", {
        fc.SESSION_MANAGER: "#!/bin/sh\necho \"config is $2\"\necho 'boom: bad config'\nexit 3\n",
        fc.EXECUTOR_MANAGER: "#!/bin/sh\nexit 0\n"})
    cl = fc.FlameCluster(bins, tmp_path / "w", startup_timeout_s=10)
    with pytest.raises(ParityError, match=r"flame-session-manager \(pid \d+\) exited during startup \(exit code 3\) "
                                          r"\(boom: bad config\); log: .*/fsm.out$") as err:
        with cl:
            pass
    assert "\n" not in str(err.value)
    assert "flame-cluster.yaml" in (tmp_path / "w" / "logs" / "fsm.out").read_text()
    assert cl.receipt["clean"] and cl.receipt["processes"][0]["exit_code"] == 3
    assert cl.receipt["ended_by"] == "error"
    assert validate_document(cl.receipt) == []


def test_startup_timeout_stops_the_hung_service(tmp_path):
    bins = fake_bin_dir(tmp_path / "bin", {name: "#!/bin/sh\nexec sleep 60\n" for name in fc.BINARIES})
    cl = fc.FlameCluster(bins, tmp_path / "w", startup_timeout_s=1)
    with pytest.raises(ParityError, match="not ready after 1s"):
        cl.start()
    (sm,) = cl.receipt["processes"]
    assert sm["name"] == fc.SESSION_MANAGER and sm["signal"] == "SIGTERM"
    assert cl.receipt["clean"] and sorted(cl.receipt["ports_released"]) == [cl.port, cl.port + 1]
    with pytest.raises(ProcessLookupError):
        os.kill(sm["pid"], 0)


def test_leftover_services_are_found_by_tree_and_by_socket_dir(tmp_path):
    sock_dir = tmp_path / "s"
    env = {**os.environ, "FLAME_INSTANCE_ENDPOINT": f"{sock_dir}/e1.sock"}
    # A parent with a child in its own process group, like the EM and a service it spawned.
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
                               " process_group=0)\n"
                               "time.sleep(60)"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not procs.descendants(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = procs.descendants(parent.pid)
        assert os.getpgid(child) == child and os.getsid(child) == parent.pid
        assert sorted(procs.session_members(parent.pid)) == sorted([parent.pid, child])
        assert sorted(fc.processes_using_socket_dir(sock_dir)) == sorted([parent.pid, child])
        assert fc.processes_using_socket_dir(tmp_path / "other") == []
        table = procs.proc_table()
        entries = procs.stop_foreign({child: (table[child][1], table[child][2])}, timeout_s=5)
        assert entries == [{"pid": child, "name": table[child][2], "exit_code": None, "signal": "SIGTERM"}]
        assert not procs.alive(child, table[child][1])
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


# ---- a real cluster ----------------------------------------------------------------------------

@real_flame
def test_real_cluster_runs_an_echo_task_and_cleans_up(tmp_path):
    import flamepy

    gpu = "GPU-parity-test-0"
    with fc.FlameCluster(real_bin_dir(), tmp_path / "flame", startup_timeout_s=60) as cl:
        (app,) = cl.register_gpu_applications("echo", sys.executable, [str(ECHO)], [gpu])
        session = cl.connection.create_session(flamepy.SessionAttributes(application=app, min_instances=1,
                                                                         max_instances=1))
        output = session.run(b"hello").result(timeout=120)
        executor_id, pinned, rest = output.split(b":", 2)
        assert (pinned.decode(), rest) == (gpu, b"hello")
        executors = {e["id"]: e for e in cl.executors()}
        assert executor_id.decode() in executors, executors
        assert executors[executor_id.decode()]["session_id"] == session.id
        assert executors[executor_id.decode()]["node"]
        session.close()
    receipt = cl.receipt
    assert receipt["clean"], receipt["errors"]
    assert validate_document(receipt) == []
    assert receipt["gpus_released"] == [gpu]
    assert {p["name"] for p in receipt["processes"]} >= set(fc.BINARIES)
    assert fc.processes_using_socket_dir(cl.socket_dir) == []
