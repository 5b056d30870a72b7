"""The mutation catalogue (``mutants``), its runner and report (``python -m ci.mutation``):
the suite must fail against each deliberately broken torch."""
