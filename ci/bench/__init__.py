"""Benchmarks of the state-dict machinery: the cases and their worlds, the A/B comparison of
two torch builds (``python -m ci.bench.compare``) and the harness's per-test overhead
(``python -m ci.bench.harness_overhead``)."""
