"""``gpuperfd probe``'s command line as the tests of tests/commands/test_probe_cli*.py read it."""

from __future__ import annotations

import argparse

from gpuperfd.commands import probe as cli
from gpuperfd.probing import matrix


def parse(argv: list[str]) -> argparse.Namespace:
    """``gpuperfd probe ARGV`` parsed by the real parser (usage errors exit 2 as on the command line)."""
    parser = argparse.ArgumentParser(prog="gpuperfd")
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["probe", *argv])


def options(argv: list[str]) -> matrix.ProbeOptions:
    """The probe options ``gpuperfd probe ARGV`` runs with."""
    return cli.options_of(parse(argv))
