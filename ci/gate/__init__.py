"""The gate: one run of the conformance suite (``python -m ci.gate``), its recorder,
results file and reports, and the probe of the torch under test (``python -m ci.gate.probe``)."""
