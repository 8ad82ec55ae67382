"""``search-r1-inspect``: see what the agent did, in a page a browser opens from disk or in the terminal.

    search-r1-inspect RUN_DIR_OR_EVAL_DIR [--step N] [--split train|val|test] [--out report.html] [--limit N]
    search-r1-inspect A B [--step N] [--split S] [--out compare.html] [--limit N]
    ... --text [--show ID]
    search-r1-inspect --monitors RUN_DIR [key=value ...]

One path: its trajectories (a run directory's training samples and validation generations, an evaluation's
``trajectories.jsonl``, a directory of ``<step>.jsonl`` or one such file; ``search_r1.inspect.records``), a sample
of at most ``--limit``, with filters and each trajectory's turns. Two paths: each one step of one split (an
evaluation, or ``--step``/``--split``, or a ``<step>.jsonl`` file), compared on the questions both hold: the ones
one got right and the other wrong, side by side, and the EM difference with its paired bootstrap 95% interval
(``search_r1.inspect.compare``). ``--text`` prints the same with rich instead of writing a page. ``--monitors``
replays the health alarms over a run directory (its config, metrics and kept trajectories; ``key=value`` arguments
try other thresholds) and prints when each fired against when the score fell (``search_r1.inspect.monitors``).

Exit status 0; 2 with ``error: <message>`` naming the bad path, step or option (nothing is written then).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from search_r1.inspect.compare import Comparison, compare
from search_r1.inspect.page import compare_page, view_page, write_page
from search_r1.inspect.records import SPLITS, InspectInputError, Loaded, load

DEFAULT_LIMIT = 300  # trajectories on a page (a view) or changed questions (a comparison)
DEFAULT_OUT = "inspect.html"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="search-r1-inspect", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a run directory, an evaluation directory, a directory of <step>.jsonl or one .jsonl file; "
                        "two paths: compare them")
    p.add_argument("--step", type=int, default=None, help="only this step (of each path when comparing)")
    p.add_argument("--split", choices=SPLITS, default=None,
                   help="only training samples (train), validation generations (val) or evaluations (test)")
    p.add_argument("--out", type=Path, default=None, help=f"the HTML page to write (default {DEFAULT_OUT}; with "
                                                          "--text none unless given)")
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                   help="at most this many trajectories (comparing: changed questions), a random sample beyond")
    p.add_argument("--text", action="store_true", help="print to the terminal (rich) instead of writing a page")
    p.add_argument("--monitors", action="store_true",
                   help="replay the health alarms over the run directory PATH (then key=value: other thresholds) "
                        "and print when each fired")
    p.add_argument("--show", default=None, metavar="ID",
                   help="with --text: print this trajectory (a uid or list id; comparing: a question id qN)")
    args = p.parse_args(argv)
    if args.monitors:
        if any("=" not in arg for arg in args.paths[1:]):
            p.error("--monitors takes one run directory, then only key=value settings (trainer.alarm_*, monitors.*)")
        return args
    if len(args.paths) > 2:
        p.error(f"give one path to view or two to compare, got {len(args.paths)}")
    if args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    if args.show is not None and not args.text:
        p.error("--show prints one trajectory in the terminal: use it with --text (the page shows each on a click)")
    if args.out is None and not args.text:
        args.out = Path(DEFAULT_OUT)
    return args


def check_out(out: Path) -> None:
    """``out`` can be written: not a directory, in a directory that exists."""
    if out.is_dir():
        raise InspectInputError(f"--out {out} is a directory; name the HTML file to write (e.g. {out / DEFAULT_OUT})")
    if not out.parent.is_dir():
        raise InspectInputError(f"--out {out}: the directory {out.parent} does not exist (create it first)")


def view(path: str | Path, out: str | Path, step: int | None = None, split: str | None = None,
         limit: int = DEFAULT_LIMIT) -> Loaded:
    """Write the page of ``path``'s trajectories (a run directory, an evaluation directory, a file) to ``out``."""
    check_out(Path(out))
    loaded = load(path, step, split, limit)
    write_page(view_page(loaded, limit), Path(out))
    return loaded


def compare_paths(a: str | Path, b: str | Path, step: int | None = None, split: str | None = None) -> Comparison:
    """The comparison of ``a`` and ``b`` (every trajectory of each: the EM figures cover all matched questions)."""
    return compare(load(a, step, split, None, side="a"), load(b, step, split, None, side="b"))


def run(args: argparse.Namespace) -> None:
    """Check the inputs, load, then write the page and/or print."""
    if args.monitors:
        from search_r1.inspect.monitors import print_replay, replay

        print_replay(replay(args.paths[0], args.paths[1:]), _console())
        return
    if args.out is not None:
        check_out(args.out)
    if len(args.paths) == 1:
        loaded = load(args.paths[0], args.step, args.split, args.limit)
        if args.text:
            from search_r1.inspect.terminal import print_view

            print_view(loaded, args.limit, args.show, _console())
        if args.out is not None:
            write_page(view_page(loaded, args.limit), args.out)
            print(f"wrote {args.out}: {len(loaded.records):,} of {loaded.total:,} trajectories")
        return
    cmp = compare_paths(*args.paths, args.step, args.split)
    if args.text:
        from search_r1.inspect.terminal import print_compare

        print_compare(cmp, args.limit, args.show, _console())
    if args.out is not None:
        write_page(compare_page(cmp, args.limit), args.out)
        print(f"wrote {args.out}: {cmp.summary()}")


def _console():
    from rich.console import Console

    return Console(markup=False, highlight=False)  # texts are shown as written: no [style] markup read in them


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        run(args)
    except InspectInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
