"""Performance tools: the report (`python -m bench`), the tuner (`python -m bench tune`),
the shape table (cases.py), peers, timing, roofline, and the asv suite (bench/benchmarks).

Importing this package does nothing costly: no kernels compile and no peers load."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository (subprocess cwd)


def write_json(path, obj):
    """Write a results file (the --json option of the bench tools), creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=str)


def tool_parser(prog, doc, rounds, children):
    """The command line shared by the tools that time each side in a child process of its
    own (bench.runtime, bench.model): --rounds, --json, and the hidden --child/--out."""
    import argparse
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--child", choices=tuple(children), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p
