"""A TCP listener in front of the evaluation's unix socket, for clients that know only TCP.

    python -m arbiter.client.socket_bridge [--listen HOST:PORT] [--any-loopback] [--if-free] [--redis-url URL] \
        -- AGENT_COMMAND...

flatland-rl's own ``FlatlandRemoteClient`` connects to ``$redis_ip`` on port 6379 with no
password, and knows no unix socket. A hosted agent's container has no network (loopback only),
and its Redis is reached through a unix socket mounted into it, as the participant's own Redis
user. The bridge listens on ``--listen`` (127.0.0.1:6379) inside the agent's network namespace,
connects each client it accepts to the socket of ``--redis-url`` (``$ARBITER_REDIS_URL``),
authenticates that connection as the URL's user, then passes bytes both ways: an unmodified
flatland client works, with the participant's rights and no more.

It listens before it starts the agent command, passes SIGTERM, SIGINT and SIGHUP on to it, and
exits with its status once it exits (128 + N for a signal N, as a shell says it). As the first
process of a container it is what the engine signals. Its imports are the standard library's.
With ``--any-loopback`` (agents of several evaluations on one machine, each wanting port 6379) a
taken loopback address gives way to the next free one on the same port (127.0.0.2, 127.0.0.3,
...), which the agent gets as ``$redis_ip``, where flatland's client looks for its host. With
``--if-free`` (an agent whose own client uses the socket) an address that cannot be had is said
on stderr and the agent runs anyway, without the TCP path.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

PR_SET_PDEATHSIG = 1  # linux/prctl.h

DEFAULT_LISTEN = "127.0.0.1:6379"
LOOPBACK_HOSTS = 64  # how many loopback addresses --any-loopback tries: 127.0.0.1 to 127.0.0.64
CHUNK = 64 * 1024
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class BridgeError(Exception):
    pass


def parse_unix_url(url: str) -> tuple[str, str | None, str | None]:
    """(socket path, user, password) of a ``unix://[user:password@]/path`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "unix" or not parts.path:
        raise BridgeError(f"--redis-url must be a unix:// URL with a socket path, got {parts.scheme}://...")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return parts.path, user, password


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BridgeError(f"--listen must be HOST:PORT, got {text!r}")
    return host, int(port)


def resp_command(*words: str) -> bytes:
    """One Redis command in the protocol's framing."""
    encoded = [word.encode("utf-8") for word in words]
    return b"".join([b"*%d\r\n" % len(encoded), *(b"$%d\r\n%s\r\n" % (len(word), word) for word in encoded)])


def open_upstream(socket_path: str, user: str | None, password: str | None) -> socket.socket:
    """A connection to the socket, authenticated as ``user`` when a password is given."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(socket_path)
        if password is not None:
            upstream.sendall(resp_command("AUTH", *([user] if user else []), password))
            answer = _read_line(upstream)
            if not answer.startswith(b"+OK"):
                refusal = answer.decode(errors="replace").strip()
                raise BridgeError(f"the evaluation's Redis refused the bridge's AUTH: {refusal}")
    except BaseException:
        upstream.close()
        raise
    return upstream


def _read_line(connection: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\r\n"):
        byte = connection.recv(1)
        if not byte:
            raise BridgeError("the evaluation's Redis closed the connection during AUTH")
        line += byte
    return line


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Bytes from ``source`` to ``target`` until ``source`` ends; then ``target`` is told."""
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass  # either side went away: both are closed below
    finally:
        try:
            target.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve_client(client: socket.socket, socket_path: str, user: str | None, password: str | None) -> None:
    try:
        upstream = open_upstream(socket_path, user, password)
    except (OSError, BridgeError) as exc:
        print(f"arbiter socket bridge: {exc}", file=sys.stderr, flush=True)
        client.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept_forever(listener: socket.socket, socket_path: str, user: str | None, password: str | None) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # the listener was closed
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_client, args=(client, socket_path, user, password), daemon=True).start()


def listen(address: tuple[str, int]) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
    except OSError as exc:
        listener.close()
        raise BridgeError(f"cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}") from None
    listener.listen(64)
    return listener


def _dying_with_the_bridge() -> Callable[[], None] | None:
    """Linux: the kernel kills the agent when the bridge ends, killed included (the bridge is
    killed with the evaluation that started it): no agent left behind without its bridge. The
    bridge runs no threads of other libraries, so a preexec function is safe here."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    bridge = os.getpid()

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != bridge:  # the bridge ended before the signal was set
            os.kill(os.getpid(), signal.SIGKILL)

    return set_death_signal


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def listen_on_loopback(address: tuple[str, int]) -> socket.socket:
    """A listener on ``address``, else on the first free loopback address (127.0.0.N) at its port."""
    try:
        return listen(address)
    except BridgeError as taken:
        if not address[0].startswith("127."):
            raise
        for n in range(1, LOOPBACK_HOSTS + 1):
            host = f"127.0.0.{n}"
            if host != address[0]:
                try:
                    return listen((host, address[1]))
                except BridgeError:
                    continue
        raise BridgeError(f"{taken}, nor on any of 127.0.0.1 to 127.0.0.{LOOPBACK_HOSTS}") from None


def run(
    listen_at: str, redis_url: str, command: list[str], *, if_free: bool = False, any_loopback: bool = False
) -> int:
    socket_path, user, password = parse_unix_url(redis_url)
    address = parse_listen(listen_at)
    environment = None  # the bridge's own
    try:
        listener: socket.socket | None = listen_on_loopback(address) if any_loopback else listen(address)
    except BridgeError as exc:
        if not if_free:
            raise
        print(f"arbiter socket bridge: {exc}; flatland's client of this agent will not reach it", file=sys.stderr)
        listener = None
    if listener is not None:
        host = listener.getsockname()[0]
        if host != address[0]:
            print(f"arbiter socket bridge: {address[0]}:{address[1]} is taken; listening on {host}:{address[1]}, "
                  "given to the agent as $redis_ip", file=sys.stderr)  # fmt: skip
            environment = {**os.environ, "redis_ip": host}
        threading.Thread(
            target=_accept_forever, args=(listener, socket_path, user, password), name="bridge", daemon=True
        ).start()
    try:
        agent = subprocess.Popen(command, env=environment, preexec_fn=_dying_with_the_bridge())
    except OSError as exc:
        raise BridgeError(f"cannot start the agent {command!r}: {exc}") from None

    def forward(signum: int, frame: object) -> None:
        try:
            agent.send_signal(signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    status = agent.wait()
    if listener is not None:
        listener.close()
    return exit_status(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arbiter.client.socket_bridge",
        description="Serve the evaluation's unix-socket Redis on a TCP address, then run the agent command.",
    )
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"default {DEFAULT_LISTEN}")
    parser.add_argument(
        "--any-loopback",
        action="store_true",
        help="a taken loopback address gives way to the next free one on the same port, given to the agent as "
        "$redis_ip",
    )
    parser.add_argument("--if-free", action="store_true", help="a taken address is a warning: the agent runs anyway")
    parser.add_argument("--redis-url", metavar="URL", help="unix://USER:PASSWORD@/PATH (default $ARBITER_REDIS_URL)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the agent command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    redis_url = args.redis_url or os.environ.get("ARBITER_REDIS_URL")
    if not command:
        parser.error("no agent command: use  python -m arbiter.client.socket_bridge -- python run.py")
    if not redis_url:
        parser.error("no Redis: give --redis-url or set ARBITER_REDIS_URL")
    try:
        return run(args.listen, redis_url, command, if_free=args.if_free, any_loopback=args.any_loopback)
    except BridgeError as exc:
        print(f"arbiter socket bridge: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
