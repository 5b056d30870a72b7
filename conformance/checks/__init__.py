"""The check modules: each judges one contract of torch's state dicts over the cells that it
applies to (``conformance/CATALOGUE.md`` lists them)."""
