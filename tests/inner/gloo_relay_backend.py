"""A process-group backend registered out of tree, as a vendor's extension registers its own:
``gloo_relay`` makes gloo process groups under a name torch does not know. Preloaded with
``HARNESS_PRELOAD=gloo_relay_backend``."""

from datetime import timedelta

import torch.distributed as dist

NAME = "gloo_relay"


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    return dist.ProcessGroupGloo(store, rank, size, timeout)


dist.Backend.register_backend(NAME, _create, devices=["cpu"])
