"""python -m bench            the performance report (quick: a few minutes)
python -m bench --full     more shapes, more rounds
python -m bench tune [ops] time candidate implementations and parameters, write the tuning cache

See bench/report.py and bench/tune.py.
"""
from __future__ import annotations

import argparse
import os
import sys


def _report_parser():
    p = argparse.ArgumentParser(prog="python -m bench", description=(
        "Performance report: machine, ceilings, every registered op at model-derived shapes vs numpy / "
        "PyTorch / onnxruntime, compile times, predicted CUDA times, JSON and a roofline plot. "
        "Subcommand: `python -m bench tune [ops...]` (see `python -m bench tune --help`)."))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", default=True, help="the quick set of shapes (default)")
    g.add_argument("--full", action="store_true", help="all shapes in bench/cases, more rounds")
    p.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (default: all registered)")
    p.add_argument("--json", default="bench_out/report.json", metavar="PATH", help="results file (default %(default)s)")
    p.add_argument("--plot", default="bench_out/roofline.png", metavar="PATH", help="roofline PNG (default %(default)s)")
    p.add_argument("--no-peers", action="store_true", help="numpy as the only peer (skip PyTorch and onnxruntime)")
    p.add_argument("--no-runtime", action="store_true", help="skip the settings (a)-(e) of bench/runtime.py")
    p.add_argument("--no-model", action="store_true", help="skip the model-level row (bench/model.py)")
    p.add_argument("--no-compile-time", action="store_true", help="skip the fresh-process compile-time measurement")
    return p


def _tune_parser():
    p = argparse.ArgumentParser(prog="python -m bench tune", description=(
        "Time each candidate implementation and its tunable parameters on the shape buckets of "
        "bench/cases and store the winners in the tuning cache ($NK_TUNING_CACHE, else the user's cache dir)."))
    p.add_argument("ops", nargs="*", help="ops to tune (default: all registered)")
    p.add_argument("--quick", action="store_true", help="only the quick shapes")
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float64"])
    p.add_argument("--cache", metavar="PATH", help="tuning cache file (sets NK_TUNING_CACHE for this run)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if argv and argv[0] == "tune":
        a = _tune_parser().parse_args(argv[1:])
        if a.cache:
            os.environ["NK_TUNING_CACHE"] = os.path.abspath(a.cache)
        import numpy as np

        from . import tune
        from .report import Progress

        tune.tune(a.ops or None, quick=a.quick, dtypes=[np.dtype(d) for d in a.dtype], store=not a.dry_run,
                  progress=Progress())
        return 0
    a = _report_parser().parse_args(argv)
    from . import peers, report

    report.run(quick=not a.full, ops=a.ops, json_path=a.json, plot_path=a.plot,
               peers=("numpy",) if a.no_peers else peers.PEERS, compile=not a.no_compile_time,
               runtime_settings=not a.no_runtime, model=not a.no_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
