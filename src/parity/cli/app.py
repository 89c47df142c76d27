"""The `parity` group every command module adds its commands to, and where progress goes."""

from __future__ import annotations

import functools

import click

from parity import __version__

echo = functools.partial(click.echo, err=True)  # progress goes to stderr; results to stdout


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="parity")
def main():
    """Reproduce "Bringing Flame Serving Close to Standalone vLLM": traces, runs, checks, report."""
