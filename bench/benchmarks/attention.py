"""asv benchmarks of the attention family: one class per op (see _suite.py for the parameters
and what each benchmark measures)."""
from ._suite import family_classes

globals().update(family_classes("attention"))
