"""Helpers formats share to build what goes on the wire and into records: an env's values made
plain (``plain``), a server-side step's reply (``step_reply``), a figure JSON can hold
(``finite``). Formats import them from ``base``, beside the classes they extend."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from arbiter.protocol.messages import EXTENSION_KEY

_PLAIN_SCALARS = (str, int, float, bool, type(None))


def plain(value: Any, _depth: int = 0) -> Any:
    """A value made of what the wire carries (maps, lists, scalars, plain numpy), so an env's
    ``info`` never breaks a reply: anything else travels as its ``repr``."""
    if type(value) is dict and not value:  # most envs' info on most steps
        return {}
    if isinstance(value, _PLAIN_SCALARS) or _depth > 16:
        return value if isinstance(value, _PLAIN_SCALARS) else repr(value)
    if isinstance(value, np.ndarray):
        return value if value.dtype.kind in "biufc" else value.tolist()
    if isinstance(value, (np.bool_, np.number)):
        return value.item()
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int)) else str(k): plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, _depth + 1) for v in value]
    return repr(value)


def step_reply(
    last: tuple[Any, float, bool, bool, Any], *, done: bool, step: int, invalid: int, info: Any = None, **ext: Any
) -> dict[str, Any]:
    """An ENV_STEP_RESPONSE body of a server-side format from a Gymnasium step's 5-tuple: the
    step's results, where the item stands (``done``, ``step``), and the format's extension
    fields (``stage_over`` at least). ``info`` replaces the env's info (already plain data)."""
    observation, reward, terminated, truncated, env_info = last
    return {
        "observation": observation,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "info": plain(env_info) if info is None else info,
        "done": done,
        "step": step,
        "invalid_actions": invalid,
        EXTENSION_KEY: ext,
    }


def finite(value: float) -> float | None:
    """JSON has no inf or NaN: such a figure is recorded as null."""
    return value if math.isfinite(value) else None
