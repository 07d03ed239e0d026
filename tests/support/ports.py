"""Free loopback ports for servers a test starts that bind their port themselves (a
`redis-server`, an example's process), and ports nothing listens on.

The kernel hands out ephemeral ports (bind to port 0, outgoing connections) from
/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default, to every process on the
machine: a port found free there can be taken by a test of another worker before the server
binds it. So each worker draws from a block of its own below that range, where only its own
tests (one at a time) bind.
"""

from __future__ import annotations

import random
import socket

from tests.support.workers import worker_index

FIRST_PORT = 20000
BLOCK = 500  # ports per worker: 20000-20499 for gw0, 20500-20999 for gw1, ...
MAX_WORKERS = 24  # 20000 + 24 * 500 = 32000, below the ephemeral range


def free_port() -> int:
    """A port of this worker's block that nothing listens on now. Drawn at random, so a test
    that asks twice before binding either gets two different ports almost always."""
    index = worker_index()
    if index >= MAX_WORKERS:
        raise RuntimeError(f"at most {MAX_WORKERS} test workers have a port block of their own")
    first = FIRST_PORT + index * BLOCK
    for port in random.sample(range(first, first + BLOCK), BLOCK):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (another service, or a connection still in TIME_WAIT)
            return port
    raise RuntimeError(f"no free port in {first}-{first + BLOCK - 1}")
