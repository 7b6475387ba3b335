"""What the command line's options take, each value checked as it is read: a bad one is refused
by the parser with the value named (``arbiter run --step-timeout 0``: '0' must be positive)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

DEFAULT_SERVICE_ID = "T12345"  # flatland's client's default submission id


KIND_WORDS = {int: "a whole number", float: "a number"}  # how an option's expected value is named


def positive(kind: type) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {KIND_WORDS.get(kind, kind.__name__)}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def count(text: str) -> int:
    """A whole number >= 0 (``--record 0`` turns off recording a competition file asks for; a seed,
    which numpy's seed sequences take no other way)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def seconds(text: str) -> float:
    """A number of seconds >= 0 (``--time-bank 0`` turns off a bank a competition file grants)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def folder(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty folder name")
    return text


def participant(text: str) -> str:
    """A participant's name, as a leaderboard shows it: not empty, and one line."""
    name = text.strip()
    if not name:
        raise argparse.ArgumentTypeError("is empty: name the participant the evaluation is for")
    if not name.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r} holds a control character (a line break, a tab ...)")
    return name
