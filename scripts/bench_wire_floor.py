#!/usr/bin/env python3
"""How many request/reply round trips per second two processes can make at all, with no
evaluator and no env: the floor under every remote step arbiter makes.

    python scripts/bench_wire_floor.py [--trips N] [--rounds R] [--reply-bytes B]

A responder process answers every short message of a requester process with ``--reply-bytes``
bytes (as short as the request by default; the size of a DIAMBRA step reply with its native frame
inline, as bench_diambra.py reports it, gives the floor under a frame that travels through Redis):

  pipe          ``multiprocessing.Pipe`` (what Gymnasium's AsyncVectorEnv steps over);
  raw-unix      through a redis-server, hand-packed commands on plain sockets: the requester
                sends LPUSH + BLPOP in one write, the responder BRPOP, then RPUSH + BRPOP in one
                write (arbiter's step shape), over the server's unix socket;
  raw-unix-poll the same, the requester polling its socket for the reply before sleeping on it
                (what arbiter's client does: ``protocol/spin_wait.py``);
  raw-tcp       raw-unix over loopback TCP;
  arbiter-unix  the same commands through arbiter's own packets (``protocol.redis_conn.Packets``
                on redis-py connections: what RemoteEnv and the evaluator send, the requester
                polling as RemoteEnv does by default), unix socket;
  arbiter-tcp   the same over loopback TCP.

A round trip through Redis wakes four processes in turn (requester → redis → responder → redis →
requester) where a pipe wakes two; on a machine with few cores (and on a VM, where waking an idle
vCPU is dear) that, not Python, sets the floor. A requester that polls is not woken. What one
such wake-up costs the process that writes is printed last (wake_cost.py): a write whose reader
sleeps on another CPU, on the writer's own, and one whose reader polls.

The target (``TARGET``): arbiter's own round trip over the unix socket against the pipe's, the
trip AsyncVectorEnv steps over (bench_remote_env.py's peer), per round. Only 127.0.0.1 and a unix
socket in a private temporary folder are used; the redis-server is stopped by its pid on the way
out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import select
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis
from harness import BenchSession, Target, machine_info, machine_line, per_round_ratios
from wake_cost import report as wake_cost_report

MESSAGE = b"x" * 40
REPLY_CHUNK = 1 << 20  # what a reader of large replies reads at once (RemoteEnv's, for frames)
REQUESTS, REPLIES = "floor:requests", "floor:replies"
PATHS = ("pipe", "raw-unix", "raw-unix-poll", "raw-tcp", "arbiter-unix", "arbiter-tcp")
POLL_WINDOW_S = 0.001  # the requester's, as RemoteEnv's default
TARGET = Target("arbiter_unix_over_pipe", "arbiter-unix", "pipe", "in round trips/s", 1.0, at_least=True)


class RawConnection:
    """Hand-packed commands on a plain socket, replies parsed by hiredis: as little Python as a
    Redis round trip can take."""

    def __init__(self, where: str | int, polls: bool = False):
        from arbiter.protocol.redis_conn import packed  # large arguments framed by hand, as arbiter does

        self.packed = packed
        self.poll = None
        if isinstance(where, str):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(where)
        else:
            self.sock = socket.create_connection(("127.0.0.1", where))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        if polls:
            poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
            self.poll = poller.poll

    def run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        for piece in self.packed(commands):
            self.sock.sendall(piece)
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = self.reader.gets()
            if reply is False:
                if self.poll is not None:
                    give_up = time.perf_counter() + POLL_WINDOW_S
                    while not self.poll(0) and time.perf_counter() < give_up:
                        pass
                self.reader.feed(self.sock.recv(REPLY_CHUNK))
            else:
                replies.append(reply)
        return replies


def packets_connection(url: str, polls: bool = False, large: bool = False) -> Any:
    from arbiter.protocol.redis_conn import READ_CHUNK, Packets, connect
    from arbiter.protocol.spin_wait import SpinWait

    client = connect(url, socket_timeout_s=30.0, read_chunk=REPLY_CHUNK if large else READ_CHUNK)
    return Packets(client, waiter=SpinWait(POLL_WINDOW_S) if polls else None)


def redis_responder(make: Callable[[bool], Any], trips: int, reply: bytes) -> None:
    connection = make(False)  # the evaluator's side never polls
    found = connection.run([("BRPOP", REQUESTS, 10)])[0]
    for _ in range(trips - 1):
        if found is None:
            raise RuntimeError("no request came within 10 s")
        found = connection.run([("RPUSH", REPLIES, reply), ("BRPOP", REQUESTS, 10)])[1]
    connection.run([("RPUSH", REPLIES, reply)])


def redis_requester(make: Callable[[bool], Any], trips: int, polls: bool) -> float:
    connection = make(polls)
    connection.run([("PING",)])
    started = time.perf_counter()
    for _ in range(trips):
        connection.run([("LPUSH", REQUESTS, MESSAGE), ("BLPOP", REPLIES, 10)])
    return trips / (time.perf_counter() - started)


def pipe_responder(end: Any, trips: int, reply: bytes) -> None:
    for _ in range(trips):
        end.recv_bytes()
        end.send_bytes(reply)


def measure(path: str, trips: int, reply: bytes, unix_path: str, port: int, url_unix: str, url_tcp: str) -> float:
    large = len(reply) > 64 * 1024
    if path == "pipe":
        mine, theirs = multiprocessing.Pipe()
        responder = multiprocessing.Process(target=pipe_responder, args=(theirs, trips, reply))
        responder.start()
        started = time.perf_counter()
        for _ in range(trips):
            mine.send_bytes(MESSAGE)
            mine.recv_bytes()
        rate = trips / (time.perf_counter() - started)
    else:
        make: Callable[[bool], Any] = {
            "raw-unix": lambda polls: RawConnection(unix_path, polls),
            "raw-unix-poll": lambda polls: RawConnection(unix_path, polls),
            "raw-tcp": lambda polls: RawConnection(port, polls),
            "arbiter-unix": lambda polls: packets_connection(url_unix, polls, large),
            "arbiter-tcp": lambda polls: packets_connection(url_tcp, polls, large),
        }[path]
        responder = multiprocessing.Process(target=redis_responder, args=(make, trips, reply))
        responder.start()
        rate = redis_requester(make, trips, polls=path.startswith("arbiter") or path.endswith("-poll"))
    responder.join(30)
    if responder.exitcode != 0:
        raise RuntimeError(f"{path}: the responder failed (exit code {responder.exitcode})")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=20_000, help="round trips per path and round (default 20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over every path (default 3)")
    parser.add_argument("--reply-bytes", type=int, default=len(MESSAGE), help="bytes of each reply (default 40)")
    args = parser.parse_args()
    if args.reply_bytes < 1:
        parser.error("--reply-bytes must be at least 1")
    reply = b"y" * args.reply_bytes
    multiprocessing.set_start_method("fork")
    machine = machine_info()
    rates: dict[str, list[float]] = {path: [] for path in PATHS}
    with BenchSession("arbiter-bench-floor-", script=Path(__file__).resolve()) as session:
        session.start_redis()
        server = session.redis
        if server.unix_socket is None:
            print("bench: the redis-server has no unix socket here (temporary folder path too long)", file=sys.stderr)
            return 2
        for round_ in range(args.rounds):
            for path in PATHS:
                rate = measure(
                    path, args.trips, reply, str(server.unix_socket), server.port, server.local_url, server.url
                )
                rates[path].append(rate)
                print(f"bench: round {round_ + 1} {path:<13} {rate:8.0f} round trips/s", file=sys.stderr)
    print(
        f"\nRound trips between two processes — {args.trips} per path and round, {args.rounds} round(s), "
        f"{len(MESSAGE)}-byte requests and {args.reply_bytes}-byte replies; {machine_line(machine)}"
    )
    print(f"{'path':<13} {'round trips/s: median [min–max]':<34} {'µs each':>8}")
    for path in PATHS:
        median = statistics.median(rates[path])
        print(f"{path:<13} {median:>9.0f} [{min(rates[path]):.0f}–{max(rates[path]):.0f}]{'':<12} {1e6 / median:8.1f}")
    rounds = [{"rate": rate} for rate in rates["arbiter-unix"]], [{"rate": rate} for rate in rates["pipe"]]
    print(TARGET.line(per_round_ratios(*rounds, "rate")))
    print()
    print("\n".join(wake_cost_report(args.trips, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
