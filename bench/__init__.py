"""Performance tools: the report (`python -m bench`), the tuner (`python -m bench tune`),
the shape table (cases.py), peers, timing, roofline, and the asv suite (bench/benchmarks).

Importing this package does nothing costly: no kernels compile and no peers load."""
