"""A real S3 server on loopback for the object-store checks: moto's server, in a process of
its own that lives while its parent does.

``serve`` runs in a process of its own: it serves S3 on ``127.0.0.1`` at a port the system
chooses, prints that port on its first line, and ends when its standard input closes (its
parent ended, even by SIGKILL). ``S3Server`` starts one and knows its address.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BUCKET = "conformance"
# moto accepts any credentials; fsspec's S3 store needs some, and must never look for others.
CREDENTIALS = {"key": "conformance", "secret": "conformance"}


@dataclass(frozen=True)
class S3Server:
    """A running server process and the fsspec storage options that reach it."""

    process: subprocess.Popen[str]
    port: int

    @property
    def storage_options(self) -> dict[str, Any]:
        return storage_options_at(self.port)

    @classmethod
    def start(cls) -> S3Server:
        """Start a server, wait until it serves, and make the suite's bucket there. It is
        stopped when the returned handle is collected, or when this process ends."""
        package_root = str(Path(__file__).resolve().parents[2])
        process = subprocess.Popen(
            [sys.executable, "-c", "from conformance.stores._s3_server import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=package_root,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip().isdigit():
            process.kill()
            raise RuntimeError(f"the S3 server did not start: it printed {line!r}")
        server = cls(process, int(line))
        weakref.finalize(server, _stop, process)
        import s3fs

        s3fs.S3FileSystem(**server.storage_options).mkdir(BUCKET)
        return server


def storage_options_at(port: int) -> dict[str, Any]:
    """What ``fsspec`` (s3fs) takes to speak to the server at ``port``, and only to it."""
    return {
        **CREDENTIALS,
        "endpoint_url": f"http://{HOST}:{port}",
    }


def _stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


def serve() -> None:
    """Serve S3 until standard input closes (see the module's docstring)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    sys.stdin.read()  # returns when the parent closes the pipe, or ends
    server.stop()
