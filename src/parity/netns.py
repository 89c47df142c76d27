"""Network containment: Flame v0.6.0's session manager listens on 0.0.0.0, unauthenticated, on two ports.

`session_manager/src/apiserver/mod.rs` (v0.6.0) binds the frontend on 0.0.0.0:<endpoint port> and the
backend on 0.0.0.0:<port + 1> whatever the endpoint's host says, with no authentication: whoever
reaches the host could register an application, that is run a command. Containment runs the whole
job (client, session manager, executor manager, workers, engines: the client must reach the session
manager on loopback) in a fresh network namespace that has only loopback, by re-executing the
command under `unshare --net` (root) or `unshare --user --map-root-user --net`. The process keeps
its pid, files and GPUs (CUDA, NVML and nvidia-smi were checked inside both kinds on an H200 host);
nothing outside can reach it, and it reaches nothing outside, so a contained run downloads nothing
(HF_HUB_OFFLINE=1 unless set) and vLLM is told its address (VLLM_HOST_IP=127.0.0.1 unless set).

Modes: `netns` contains or fails; `host` does not contain; `auto` contains when a real Flame cluster
will run and the platform allows it, and otherwise says why not (the stand-in binds 127.0.0.1 only).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys

from parity.errors import ParityError

MODES = ("auto", "netns", "host")
INSIDE_ENV = "PARITY_NETNS"  # in the re-executed process: the unshare flags it runs under
NONE_ENV = "PARITY_NETNS_NONE"  # why the run is not contained
FLAME_BINDS = ("0.0.0.0:{port}", "0.0.0.0:{backend}")

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def interfaces() -> list[str]:
    """The network interfaces of this process's namespace (/proc/net/dev is per namespace, /sys is not)."""
    try:
        lines = open("/proc/net/dev").read().splitlines()[2:]
    except OSError:
        return []
    return sorted(line.split(":")[0].strip() for line in lines if ":" in line)


def _loopback_up() -> None:
    """A fresh network namespace has `lo` down; bring it up (we are its root)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | _IFF_UP, b""))


def _own_argv() -> list[str] | None:
    """How to run this command again, or None when it was called in-process (tests, other programs)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if (spec is not None and spec.name == "parity.__main__") or \
            os.path.basename(getattr(main, "__file__", "") or "") == "parity":
        return [sys.executable, "-m", "parity", *sys.argv[1:]]
    return None


def _unshare_flags() -> tuple[list[str], str | None]:
    """The first `unshare` that works here, or why none does."""
    if shutil.which("unshare") is None:
        return [], "unshare (util-linux) is not installed"
    tried = []
    candidates = ([["--net"]] if os.geteuid() == 0 else []) + [["--user", "--map-root-user", "--net"]]
    for flags in candidates:
        try:
            done = subprocess.run(["unshare", *flags, "--", "true"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"unshare {' '.join(flags)}: {exc}")
            continue
        if done.returncode == 0:
            return flags, None
        tried.append(f"unshare {' '.join(flags)}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return [], "; ".join(tried)


def _not_contained(why: str) -> str:
    os.environ[NONE_ENV] = why
    return f"none: {why}"


def contain(mode: str, *, needed: bool, log=None) -> str:
    """First thing in a command: re-execute it in a fresh network namespace (does not return), or
    return how the run is contained: 'netns', or 'none: <why>'."""
    if mode not in MODES:
        raise ParityError(f"network mode {mode!r}: use one of {', '.join(MODES)}")
    if os.environ.get(INSIDE_ENV):
        _loopback_up()
        return "netns"
    if mode == "host":
        return _not_contained("network mode host")
    if mode == "auto" and not needed:
        return _not_contained("not needed: nothing this run starts listens beyond 127.0.0.1")
    argv = _own_argv()
    flags, why = _unshare_flags() if argv else ([], "the command was called in-process, so it cannot re-execute itself")
    if why:
        if mode == "netns":
            raise ParityError(f"network mode netns: cannot contain this run in a network namespace: {why}")
        if log:
            log(f"warning: Flame's ports will be open on every interface: no network namespace ({why})")
        return _not_contained(why)
    env = dict(os.environ, **{INSIDE_ENV: " ".join(flags)})
    env.pop(NONE_ENV, None)
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")  # vLLM would ask the route to 8.8.8.8 for its address
    env.setdefault("HF_HUB_OFFLINE", "1")  # nothing can be downloaded in here: fail at once, not on a timeout
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe("unshare", ["unshare", *flags, "--", *argv], env)


def containment() -> str:
    """'netns' inside a contained run, else 'none: <why>'."""
    if os.environ.get(INSIDE_ENV):
        return "netns"
    return f"none: {os.environ.get(NONE_ENV, 'not asked for')}"


def record(cluster: str, port: int) -> dict:
    """The trial manifest's `network`: what the cluster listens on, and whether that was contained."""
    if cluster == "stand-in":
        binds, note = [f"127.0.0.1:{port}"], "the stand-in's frontend, loopback only"
    else:
        binds = [b.format(port=port, backend=port + 1) for b in FLAME_BINDS]
        note = "Flame v0.6.0's session manager: frontend and backend gRPC, unauthenticated, on every interface"
    return {"binds": binds, "what": note, "containment": containment(), "interfaces": interfaces()}
