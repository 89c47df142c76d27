"""The `parity` group every command module adds its commands to, and where progress goes."""

from __future__ import annotations

import functools
import os
import signal
import sys

import click

from parity import __version__, procs

echo = functools.partial(click.echo, err=True)  # progress goes to stderr; results to stdout


class Group(click.Group):
    """Click's group, but Ctrl-C exits 130 (128 + SIGINT, as a shell and a workflow manager read it, and as SIGTERM
    exits 143 here), not Click's "Aborted!" and 1, which says nothing of the signal and reads as a failed run."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.Abort) as exc:  # the command's context managers have cleaned up by now
            if isinstance(exc, click.Abort) and not isinstance(exc.__context__, KeyboardInterrupt):
                raise  # an end of input at a prompt: Click's own "Aborted!"
            echo("parity: SIGINT: stopped")  # (Ctrl-C at a prompt reaches here as Click's Abort: outside pass N)
            raise SystemExit(128 + signal.SIGINT) from None
        except BrokenPipeError:  # stdout's reader left (`| head -1`): said, not a silent exit 1 (outside pass Q); a
            # command saves its --out before it prints
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush: no 2nd error
            echo("parity: stdout was closed before all was printed")
            raise SystemExit(128 + signal.SIGPIPE) from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="parity")
def main():
    """Reproduce "Bringing Flame Serving Close to Standalone vLLM": traces, runs, checks, report."""
    # every command: SIGTERM and SIGHUP leave through its context managers, as Ctrl-C does, so what a command had
    # half written is removed (`manifest.all_or_nothing`; a SIGTERM left a new trace's tokens beside the old
    # manifest: an outsider's, 2026-12-07), and it exits 128 + the signal
    procs.termination.enter()
    click.get_current_context().call_on_close(procs.termination.exit)


def served() -> None:
    """For a process its manager stops (a Flame worker, a simulator replica): SIGTERM ends it at once, as before
    `main` armed it; its manager's teardown, not its own, cleans up (a worker's GPU lease is a flock the kernel
    drops), and a teardown inside a gRPC or HTTP server's wait could hold up the manager's."""
    procs.termination.exit()
