"""The seed of each reset of a plan, derived from the competition's seed: ``reset_seed``, one of
the helpers formats share (``formats.base`` names it beside the others)."""

from __future__ import annotations

import hashlib
import hmac


def reset_seed(base: int | None, *path: int) -> int | None:
    """The seed of one reset (32 bits), derived from the competition seed and the reset's place
    in the plan (phase, run, episode ...): independent streams, reproducible, and recorded.

    HMAC-SHA256 keyed with ``base`` over the path, its length first (``(s, 0)`` is not ``(s,)``,
    so a seed derived for one purpose, a secret of the env, is never another's). A keyed hash
    because the agent learns every episode's seed when the episode ends: from those, a drawn
    secret base must stay as hard to find as a search of all its values, so that the seeds of the
    episodes still to come stay unknown (numpy's SeedSequence, a mix whose steps can each be
    undone, gives no such guarantee)."""
    if base is None:
        return None
    message = f"{len(path)}:{','.join(str(int(place)) for place in path)}".encode()
    digest = hmac.new(str(int(base)).encode(), message, hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big")
