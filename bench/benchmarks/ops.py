"""asv benchmarks of every registered op: one class per op, generated from the registry and
bench/cases (see _suite.py for the parameters and what each benchmark measures)."""
from ._suite import op_classes

globals().update(op_classes())
