"""Run a command in a private network namespace whose only peer is the proxy.

Usage (as root, or wherever `unshare -n` is permitted):
    unshare -n python3 netns_bridge.py --map PORT=UNIX_SOCKET [--map ...] -- COMMAND ARGS...

Inside the new namespace it brings `lo` up, listens on 127.0.0.1:PORT for each mapping and pipes
every connection to the Unix socket (the proxy listens on it in the parent namespace: the
filesystem is shared, the network is not). Then it runs COMMAND and exits with its status. The
command can reach nothing but these ports: no DNS, no internet, no other host service; an
attempt fails at once inside the kernel, so a client's hidden telemetry or update check cannot
leave the machine. Standard library only, so any python3 can run it.
"""

from __future__ import annotations

import argparse
import fcntl
import socket
import struct
import subprocess
import sys
import threading

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(listener: socket.socket, unix_path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--map", action="append", default=[], help="PORT=UNIX_SOCKET")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    loopback_up()
    for item in args.map:
        port, path = item.split("=", 1)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))
        listener.listen(64)
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
