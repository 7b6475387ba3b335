"""Many evaluations' Redis traffic from one process: what arbiter's evaluator and RemoteEnv client
send for each agent step, byte for byte in the same packets, without the Python work around it.

A machine with two cores runs a few dozen real evaluations at once (bench_redis_capacity.py
measures those); the Redis of a farm serves hundreds to thousands. What one Redis core carries
depends on how Redis's work per step changes with load: at a few dozen evaluations Redis wakes
for almost every packet alone, cold, while under a heavy load it reads many packets per wake-up.
This model puts that load on a real redis-server: ``count`` evaluations, each an evaluator
connection and an agent connection, each agent sending a request ``think_s`` after its last
reply, each evaluator answering a request a handling time after it took it. Its packets are the
real ones:

- the agent's (client/wire.py ``_push_and_wait``): RPOP of the errors list, LPUSH of the request,
  BLPOP of a reply list new for each request;
- the evaluator's (server/service/transport.py ``_wait_and_take``, with the reply of the request
  it handled in front): RPUSH and EXPIRE of the reply, CLIENT REPLY OFF, the BLMOVE wait,
  CLIENT REPLY ON, and the bounded take's EVALSHA.

The request and the reply are those of a CartPole step, encoded by arbiter's codec. Each
agent records when each of its replies came (Unix times), written to ``out`` as doubles.
"""

from __future__ import annotations

import array
import heapq
import random
import selectors
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import hiredis

from arbiter.protocol import codec, keys
from arbiter.protocol.messages import EXTENSION_KEY, request
from arbiter.protocol.redis_conn import BOUNDED_TAKE_SHA, bounded_take
from arbiter.server.service.replies import REPLY_TTL_S
from arbiter.server.service.transport import MAX_BLOCK_S, POP_BATCH, REQUEST_LIMIT, TAKE_BYTES

AGENT_REPLY_TIMEOUT_S = 30
# What the evaluator takes to handle a request before answering (decoding it, stepping the env,
# recording the step), and what an agent's own work adds to its think time: spread between
# these bounds, so that modelled evaluations answer and ask independently of one another, as
# real ones do, rather than in step.
HANDLING_S = (0.0001, 0.0004)
AGENT_WORK_S = (0.0, 0.0004)  # the agent's BLPOP, as RemoteEnv sends it (whole seconds are enough here)


def _pack(*commands: tuple) -> bytes:
    return b"".join(hiredis.pack_command(command) for command in commands)


def step_request(service_id: str, seq: int, channel: str) -> bytes:
    payload = {"action": 1, EXTENSION_KEY: {"session": "0123456789abcdef", "seq": seq}}
    return codec.encode(request("ENV_STEP", payload, channel))


def step_reply(seq: int) -> bytes:
    observation = [0.0123 * seq, -0.25, 0.031, 0.42]
    return codec.encode({"type": "ENV_STEP_RESPONSE", "payload": {
        "observation": observation, "reward": 1.0, "terminated": False, "truncated": False,
        "info": {EXTENSION_KEY: {"seq": seq}}}})  # fmt: skip


class Evaluation:
    """One modelled evaluation: its two connections and where each is in its step."""

    def __init__(self, address: tuple[str, int] | str, service_id: str, index: int):
        self.service_id = service_id
        self.index = index
        self.commands = keys.commands_key(service_id)
        self.errors = keys.errors_key(service_id)
        self.agent = _connect(address)
        self.evaluator = _connect(address)
        self.agent_reader = hiredis.Reader()
        self.evaluator_reader = hiredis.Reader()
        self.seq = 0
        self.handled: list[dict] = []  # requests taken, their replies not sent yet (the step's handling time)
        self.agent_expects = 0  # replies the agent's packet still owes it
        self.evaluator_expects = 0
        self.channel = ""
        self.wait = _pack(
            ("CLIENT", "REPLY", "OFF"),
            ("BLMOVE", self.commands, self.commands, "RIGHT", "RIGHT", MAX_BLOCK_S),
            ("CLIENT", "REPLY", "ON"),
            bounded_take(self.commands, POP_BATCH, TAKE_BYTES, REQUEST_LIMIT, cached=True),
        )

    def evaluator_waits(self, reply_to: str | None = None, reply: bytes = b"") -> None:
        """The evaluator's packet: the reply to the request it handled, if any, then the wait and take."""
        head = _pack(("RPUSH", reply_to, reply), ("EXPIRE", reply_to, REPLY_TTL_S)) if reply_to else b""
        self.evaluator_expects = (2 if reply_to else 0) + 2  # acknowledgements, CLIENT REPLY ON, the take
        self.evaluator.sendall(head + self.wait)

    def agent_requests(self) -> None:
        self.seq += 1
        self.channel = keys.response_key(self.service_id, f"{self.seq:032x}")
        self.agent_expects = 3
        self.agent.sendall(_pack(
            ("RPOP", self.errors),
            ("LPUSH", self.commands, step_request(self.service_id, self.seq, self.channel)),
            ("BLPOP", self.channel, AGENT_REPLY_TIMEOUT_S),
        ))  # fmt: skip

    def on_evaluator_data(self, data: bytes) -> None:
        self.evaluator_reader.feed(data)
        while self.evaluator_expects:
            reply = self.evaluator_reader.gets()
            if reply is False:
                return
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"{self.service_id}: Redis refused an evaluator command: {reply}")
            self.evaluator_expects -= 1
            if self.evaluator_expects == 0:  # the take's answer: the requests queued
                taken = reply
                if not taken:
                    self.evaluator_waits()  # the wait timed out with nothing queued
                    return
                for raw in taken:
                    message = codec.decode(raw, codec.COMMAND_LIMITS)
                    self.handled.append(message)

    def answer(self) -> None:
        """The evaluator's packet once it has handled the requests it took: each one's reply, the
        last in front of its next wait."""
        for message in self.handled:
            seq = message["payload"][EXTENSION_KEY]["seq"]
            self.evaluator_waits(message["response_channel"], step_reply(seq))
        self.handled.clear()

    def on_agent_data(self, data: bytes) -> bool:
        """Whether the agent's reply came."""
        self.agent_reader.feed(data)
        while self.agent_expects:
            reply = self.agent_reader.gets()
            if reply is False:
                return False
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"{self.service_id}: Redis refused an agent command: {reply}")
            self.agent_expects -= 1
            if self.agent_expects == 0:
                if reply is None:
                    raise RuntimeError(f"{self.service_id}: no reply within {AGENT_REPLY_TIMEOUT_S} s")
                codec.decode(reply[1], codec.REPLY_LIMITS)
                return True
        return False

    def close(self) -> None:
        self.agent.close()
        self.evaluator.close()


def _connect(address: tuple[str, int] | str) -> socket.socket:
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as redis-py connects
    sock.connect(address)
    return sock


def redis_address(redis_url: str) -> tuple[str, int] | str:
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return parts.path
    return parts.hostname or "127.0.0.1", parts.port or 6379


def run(redis_url: str, service_ids: list[str], think_s: float, ready: Path, go: Path, until_s: float,
        out: Path) -> None:  # fmt: skip
    """Model one evaluation per service id: connect, say it is ready, wait for ``go``, then step
    until ``until_s`` seconds after it; the reply times go to ``out``."""
    address = redis_address(redis_url)
    evaluations = [Evaluation(address, service_id, index) for index, service_id in enumerate(service_ids)]
    selector = selectors.DefaultSelector()
    for evaluation in evaluations:
        evaluation.evaluator_waits()
        selector.register(evaluation.evaluator, selectors.EVENT_READ, (evaluation, False))
        selector.register(evaluation.agent, selectors.EVENT_READ, (evaluation, True))
    ready.touch()
    while not go.exists():  # a file, so that waiting adds nothing to Redis's load
        time.sleep(0.01)
    started = time.monotonic()
    end = started + until_s
    # The agents start a think time apart from one another, as agents that began at different times.
    due = [(started + think_s * index / len(evaluations), index) for index in range(len(evaluations))]
    heapq.heapify(due)
    handling: list[tuple[float, int]] = []  # evaluators handling a request: when each answers
    jitter = random.Random(len(service_ids))
    answered = array.array("d")
    try:
        while True:
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, index = heapq.heappop(due)
                if now < end:
                    evaluations[index].agent_requests()
            while handling and handling[0][0] <= now:
                evaluations[heapq.heappop(handling)[1]].answer()
            if not due and not handling and all(e.agent_expects == 0 for e in evaluations):
                break
            next_at = min(due[0][0] if due else now + 0.05, handling[0][0] if handling else now + 0.05)
            timeout = max(0.0, next_at - now)
            for key, _ in selector.select(timeout):
                evaluation, is_agent = key.data
                data = key.fileobj.recv(1 << 16)
                if not data:
                    raise RuntimeError(f"{evaluation.service_id}: Redis closed the connection")
                if not is_agent:
                    evaluation.on_evaluator_data(data)
                    if evaluation.handled:
                        handled_at = time.monotonic() + jitter.uniform(*HANDLING_S)
                        heapq.heappush(handling, (handled_at, evaluation.index))
                elif evaluation.on_agent_data(data):
                    answered.append(time.time())
                    # the agent's own work around its think time, as a Python agent's varies
                    think = think_s + jitter.uniform(*AGENT_WORK_S)
                    heapq.heappush(due, (time.monotonic() + think, evaluation.index))
    finally:
        for evaluation in evaluations:
            evaluation.close()
        selector.close()
    with open(out, "wb") as handle:
        answered.tofile(handle)


def ensure_script(conn) -> None:
    """Load the bounded take's script, as the evaluator's first take does (EVAL)."""
    from arbiter.protocol.redis_conn import BOUNDED_TAKE_SCRIPT

    if conn.script_load(BOUNDED_TAKE_SCRIPT) != BOUNDED_TAKE_SHA:
        raise RuntimeError("the bounded take's script loaded under another digest")
