"""The server's listening addresses: their spelling, and a port checked (or held) before gRPC binds it, so a busy
port is one line naming the address and the option instead of gRPC's C-core log.

A server with front ends (serving/frontends.py) holds its port with :func:`hold_port` for its whole life: a socket
bound with SO_REUSEPORT and never listening, so no other program can take the port while front ends restart, and
the front ends (which bind with SO_REUSEPORT too) share it. Only a listening socket receives connections, so the
holder takes none.
"""

from __future__ import annotations

import socket


def address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As gRPC binds: SO_REUSEADDR lets a restart bind over its last connections' TIME_WAIT, never over a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


def check_free(host: str, port: int, option: str) -> None:
    """Raise OSError naming the address and ``option`` unless ``host:port`` can be bound now (port 0: always)."""
    if port == 0:
        return
    try:
        _bind(host, port, reuse_port=False).close()
    except OSError as e:
        raise OSError(f"could not listen on {address(host, port)}: {e.strerror or e} (another server there? choose "
                      f"another with {option})") from None


def hold_port(host: str, port: int, option: str) -> tuple[socket.socket, int]:
    """Hold ``host:port`` (port 0: a free one) for front ends to share: returns the holding socket and the port."""
    check_free(host, port, option)
    try:
        holder = _bind(host, port, reuse_port=True)
    except OSError as e:
        raise OSError(f"could not listen on {address(host, port)}: {e.strerror or e} (choose another with "
                      f"{option})") from None
    return holder, holder.getsockname()[1]
