"""The evaluator's replies on their way to the reply lists their requests named.

A reply is written in a packet of the evaluator's (``RedisTransport``) without waiting for Redis's
answer, and confirmed by Redis's acknowledgements (of its RPUSH and its EXPIRE), which are read
with a later packet's replies: answering a request costs no round trip of its own. Until
confirmed, a reply is kept: a packet that fails sends every unconfirmed reply again (a reply list
may then hold a duplicate, which its client never reads and which expires).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from arbiter.protocol.redis_conn import LARGE_ARGUMENT, THREE_ARGUMENTS, Command

log = logging.getLogger(__name__)

REPLY_TTL_S = 600  # a reply nobody reads (its client gone) leaves Redis after this
_TTL = b"%d" % REPLY_TTL_S


def framed_reply(channel: bytes, message: bytes) -> list[bytes]:
    """The commands that write ``message`` to the reply list ``channel``, packed: ``pack3``'s
    work, formatted here without its calls (the evaluator gives a reply every turn)."""
    length = len(channel)
    return [
        THREE_ARGUMENTS % (5, b"RPUSH", length, channel, len(message), message),
        THREE_ARGUMENTS % (6, b"EXPIRE", length, channel, len(_TTL), _TTL),
    ]


class Replies:
    """The replies given and not yet confirmed, in the order they were given."""

    def __init__(self) -> None:
        self.unwritten: list[tuple[str, bytes]] = []  # not written yet, or written on a lost connection
        self.unconfirmed: list[tuple[str, bytes]] = []  # written, acknowledgements not read yet
        self.refused = 0  # refused by Redis because the agent made their list a non-list

    def __bool__(self) -> bool:
        """Whether any reply is not confirmed yet."""
        return bool(self.unwritten or self.unconfirmed)

    def add(self, channel: str, message: bytes) -> None:
        self.unwritten.append((channel, message))

    def commands(self) -> list[Command]:
        """The commands that write the replies not written yet, two a reply."""
        commands: list[Command] = []
        for channel, message in self.unwritten:
            if len(message) > LARGE_ARGUMENT:  # sent as it is, never copied into a packed command
                commands += [("RPUSH", channel, message), ("EXPIRE", channel, REPLY_TTL_S)]
            else:
                commands += framed_reply(channel.encode(), message)
        return commands

    def written(self) -> None:
        """The commands of ``commands`` went out."""
        self.unconfirmed += self.unwritten
        self.unwritten.clear()

    def lost(self) -> None:
        """The connection went, with whatever it had not confirmed: all of it goes again, in order."""
        self.unwritten[:0] = self.unconfirmed
        self.unconfirmed.clear()

    def confirmed(self) -> None:
        """Redis's acknowledgements of every reply were read."""
        self.unwritten.clear()
        self.unconfirmed.clear()

    def sort_refusals(self, answers: list[Any], own: int, raise_own: bool = True, skip: range = range(0)) -> None:
        """Error answers of a packet read behind the replies: its last ``own`` answers are the
        caller's, the rest the acknowledgements of the replies (those written before the packet
        first, then those it carried), with the answers at ``skip`` among them being another
        command's (a wait written with a reply), left to its reader. A reply list that the agent
        turned into another type (it SET its own reply key) refuses the RPUSH with WRONGTYPE: that
        reply is lost to the agent by its own doing and the evaluation goes on (``refused``). Any
        other refusal (out of memory, a missing permission) is raised, and one of the caller's
        unless ``raise_own`` is False."""
        sent = self.unconfirmed + self.unwritten  # in the order of their acknowledgements
        before_own = len(answers) - own
        paired = before_own - len(skip) == 2 * len(sent)
        for index, answer in enumerate(answers):
            if not isinstance(answer, redis.ResponseError) or index in skip:
                continue
            if index >= before_own:
                if raise_own:
                    raise answer
                continue
            ack = index - len(skip) if skip and index > skip[-1] else index
            if paired and ack % 2 == 0 and str(answer).startswith("WRONGTYPE"):
                self.refused += 1
                channel = sent[ack // 2][0]
                log.warning("reply list %s is not a list (the agent changed it): that reply is dropped", channel)
                continue
            raise answer
