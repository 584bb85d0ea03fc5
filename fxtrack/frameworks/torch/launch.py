"""torchrun (``torch.distributed.run``) with its rendezvous store on loopback when every rank is
on this machine.

torch 2.13's TCPStore server listens on every interface whatever host name it is given (seen
with ``ss -ltnp`` during a ``--standalone`` run: ``*:<port>``), so a one-machine job opened a port
to the network for its whole run. The store takes a socket the caller bound instead
(``master_listen_fd``): here a server store asked for on a local name is handed one bound to
127.0.0.1. Multi-node jobs (a routable ``--master-addr``) are left as torchrun makes them.

Usage: ``python -m fxtrack.frameworks.torch.launch <torchrun's arguments>``.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def loopback_socket(port: int) -> int:
    """A listening IPv4 socket on 127.0.0.1:``port`` (0: any free port); its file descriptor,
    owned by the caller from here on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock.detach()


def loopback_store_class(base: type) -> type:
    """``base`` (torch's TCPStore), whose server on a local host name listens on 127.0.0.1."""

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        def __init__(self, host_name: str, port: int, *args: Any, **kwargs: Any) -> None:
            # TCPStore(host_name, port, world_size, is_master, ...): is_master is 4th or a keyword
            is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
            if (is_master and host_name in LOCAL_NAMES
                    and kwargs.get("master_listen_fd") is None):
                try:
                    kwargs["master_listen_fd"] = loopback_socket(int(port))
                except OSError:  # the port is taken: torch's own attempt raises the error its
                    pass  # rendezvous knows (it then joins the store there as a client)
            super().__init__(host_name, port, *args, **kwargs)

    return LoopbackTCPStore


def main(argv: list[str]) -> None:
    import torch.distributed as dist

    # Before torch.distributed.run imports its rendezvous backends, which take the name then.
    dist.TCPStore = loopback_store_class(dist.TCPStore)
    from torch.distributed import run

    run.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
