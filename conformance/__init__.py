"""The conformance suite that judges the torch build under test."""
