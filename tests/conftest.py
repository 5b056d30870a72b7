"""The project's own tests: pytester drives inner sessions of the world plugin."""

# pytester's in-process runs forget modules first imported during the run,
# and torch cannot be imported twice into one process: import it here once.
import torch  # noqa: F401

pytest_plugins = ["pytester"]
