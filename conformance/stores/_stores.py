"""Where a checkpoint goes: the stores fsspec reaches, each opened for one test.

- ``memory``: fsspec's in-memory file system, which each process holds alone: a checkpoint
  there is one process's, so it is judged at one rank, with the thread checkpointer;
- ``file``: the local disk through fsspec (``file://`` URLs);
- ``s3``: an S3 server on loopback (``_s3_server.py``), one per world, started by rank 0
  at the world's first use and ended with its process.

A test opens its store (``Store.open``) and names checkpoints in it; ``OpenStore`` gives the
URL, DCP's fsspec writer and reader for it, and the bytes of each file a checkpoint holds.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Literal

import fsspec.config
import pytest
import torch.distributed as dist

from conformance._upstream import dcp_fsspec
from conformance.stores._s3_server import BUCKET, S3Server, storage_options_at

StoreName = Literal["memory", "file", "s3"]


@dataclass(frozen=True)
class Store:
    """One kind of store; ``shared``: whether every process sees what one wrote."""

    name: StoreName
    shared: bool
    needs: tuple[str, ...] = ()  # the modules besides fsspec it is reached or served through

    def open(self, world: Any) -> OpenStore:
        """This store for the test ``world`` runs: a skip naming what is missing, where this
        environment cannot reach it. Every rank calls it alike (rank 0 may start a server)."""
        for module in self.needs:
            pytest.importorskip(module, reason=f"the {self.name} store needs {module}")
        if self.name == "s3":
            options = storage_options_at(_server_port(world))
            return OpenStore(self, f"s3://{BUCKET}/{_test_key(world)}", options)
        if self.name == "memory":
            return OpenStore(self, f"memory://{_test_key(world)}")
        return OpenStore(self, f"file://{world.tmp_path}")


@dataclass(frozen=True)
class OpenStore:
    """A store as one test uses it: checkpoints named under ``root``."""

    store: Store
    root: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def url(self, name: str) -> str:
        return f"{self.root}/{name}"

    def writer(self, name: str, **options: Any) -> Any:
        """DCP's fsspec writer of the checkpoint ``name`` (``options``: the writer's own)."""
        return self._made(dcp_fsspec.FsspecWriter, name, **options)

    def reader(self, name: str) -> Any:
        return self._made(dcp_fsspec.FsspecReader, name)

    def _made(self, kind: Any, name: str, **options: Any) -> Any:
        """``kind`` (DCP's fsspec writer or reader) of ``name``, given the store's options.
        A release whose writer and reader take none (2.6) reaches the store as its users
        do: through fsspec's configured defaults for the URL's protocol, set here."""
        parameters = inspect.signature(kind.__init__).parameters.values()
        if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
            return kind(self.url(name), **options, **self.storage_options)
        if self.storage_options:
            protocol = self.root.split("://", 1)[0]
            fsspec.config.conf[protocol] = dict(self.storage_options)
        return kind(self.url(name), **options)

    def files(self, name: str) -> dict[str, bytes]:
        """Every file the checkpoint ``name`` holds, by its name within it, with its bytes."""
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(self.url(name), **self.storage_options)
        fs.invalidate_cache()  # other processes wrote there since this one last listed
        root = root.rstrip("/")
        return {path[len(root) + 1 :]: fs.cat_file(path) for path in sorted(fs.find(root))}


STORES: dict[StoreName, Store] = {
    store.name: store
    for store in (
        Store("memory", shared=False),
        Store("file", shared=True),
        Store("s3", shared=True, needs=("s3fs", "moto")),
    )
}


def _test_key(world: Any) -> str:
    """A name for the test ``world`` runs, the same on every rank and unlike any other's."""
    return hashlib.sha256(str(world.tmp_path).encode()).hexdigest()[:16]


_server: S3Server | None = None  # the S3 server rank 0 of this process's world started


def _server_port(world: Any) -> int:
    """The port of the world's S3 server, which rank 0 starts at its first use and keeps as
    long as its process lives (a world's processes live and end together), or anew where it
    ended; every rank learns the port, or why it did not start (every rank raises it, so that
    none waits for the others)."""
    global _server
    failure = None
    if world.rank == 0 and (_server is None or _server.process.poll() is not None):
        try:
            _server = S3Server.start()
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"
    told = [_server.port if world.rank == 0 and _server is not None else 0, failure]
    dist.broadcast_object_list(told, src=0)
    if told[1] is not None:
        raise RuntimeError(f"rank 0 could not start the world's S3 server: {told[1]}")
    return int(told[0])
