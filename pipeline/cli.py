"""``tweakpipe``: the command-line tools beside ``python -m pipeline`` (which tunes), one command with a subcommand
each (``python -m pipeline.cli`` where the ``tweakpipe`` script is not installed)::

    tweakpipe trust FILE.tweak ...            sign checkpoints' compiled artifacts with your own key
    tweakpipe report [--sweep ID|latest] ...  the latency table of a sweep or an experiment, from MLflow
    tweakpipe templates [--config-dir DIR]    every backend, backend set and Inductor template, one line each

``tweakpipe COMMAND --help`` shows a command's own options. Each command is the entry point of its room (the
checkpoint's signing, the record's report, the config's templates), which the entry points sit above.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

PROG = "tweakpipe"


# Each command imports its room when it runs: ``tweakpipe templates`` needs neither torch nor a GPU.

def trust(argv: Sequence[str]) -> int:
    """``tweakpipe trust FILE.tweak ...``: sign each checkpoint's compiled artifacts with this user's key."""
    from pipeline import trust as keys
    from pipeline.route import checkpoint

    parser = argparse.ArgumentParser(
        prog=f"{PROG} trust", description="Trust compiled artifacts: sign a checkpoint's FILE.tweak.compiled with "
                                          "your own key, so pipeline.load uses them. Do it only for files whose "
                                          "origin you checked: compiled artifacts run code when loaded.")
    parser.add_argument("checkpoints", nargs="+", type=Path, help="FILE.tweak (its FILE.tweak.compiled is signed)")
    args = parser.parse_args(argv)
    failed: List[str] = []
    for path in args.checkpoints:
        try:
            signed = checkpoint.sign(path)
        except (OSError, ValueError) as exc:
            failed.append(f"{path}: {exc}")
            continue
        print(f"trusted {signed} (signed with {keys.key_path()})")
    for line in failed:
        print(f"error: {line}", file=sys.stderr)
    return 2 if failed else 0


def report(argv: Sequence[str]) -> int:
    from pipeline.record import report as latency_report

    latency_report.main(argv, prog=f"{PROG} report")
    return 0


def templates(argv: Sequence[str]) -> int:
    from pipeline.config import templates as template_listing

    template_listing.main(argv, prog=f"{PROG} templates")
    return 0


COMMANDS: Dict[str, Callable[[Sequence[str]], int]] = {"trust": trust, "report": report, "templates": templates}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=PROG, description="tweakpipe's tools beside python -m pipeline (which "
                                     "tunes): trust a checkpoint's compiled artifacts, report a sweep's latency "
                                     "table, list the backends and templates",
                                     epilog=f"{PROG} COMMAND --help shows a command's own options")
    parser.add_argument("command", choices=sorted(COMMANDS), help="trust | report | templates")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the command's own arguments")
    if not argv:
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    return COMMANDS[args.command](args.arguments)


if __name__ == "__main__":
    raise SystemExit(main())
