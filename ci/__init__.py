"""The gate's entry points: runs of the suite, their reports, and benchmark comparisons."""
