"""How arbiter counts things in the lines people read: "1 episode", "3 datasets", "2 runs".

Apart from the command line so that the evaluation's own messages (its termination causes) use the
same words without depending on the command line.
"""

from __future__ import annotations


def item_noun(count: int, format_name: str | None) -> str:
    """What ``count`` items of the format are called (its ``Format.item_nouns``); a format not
    known here (events written by another version of arbiter) plays episodes."""
    from arbiter.protocol.errors import ConfigError
    from arbiter.server.formats import get_format  # here: the registry loads formats, which use these words

    try:
        singular, plural = get_format(format_name).item_nouns if format_name else ("episode", "episodes")
    except ConfigError:
        singular, plural = "episode", "episodes"
    return singular if count == 1 else plural


def count_items(count: int, format_name: str | None, nouns: tuple[str, str] | list[str] | None = None) -> str:
    """``count`` items in the format's words: "1 episode", "3 datasets"; in ``nouns`` (singular,
    plural) when the plan named its own (``Plan.item_nouns``)."""
    if nouns is not None and len(nouns) == 2:
        return f"{count} {nouns[0] if count == 1 else nouns[1]}"
    return f"{count} {item_noun(count, format_name)}"


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else (words or word + 's')}"


def quoted_from_agent(value: object, limit: int = 80) -> str:
    """Text an agent sent, as arbiter's own lines and causes show it: control characters escaped
    (a newline or a terminal escape cannot forge a line of ours), cut to ``limit`` characters."""
    text = str(value)
    cut = len(text) > limit
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[:limit])
    return text + ("..." if cut else "")


# What continues an interrupted evaluation, by the command that ran it (the ``command`` of its
# ``started`` event): the one the user ran, never the other.
RESUME_COMMANDS = {
    "run": "`arbiter run --resume --results {results} [the same options] -- AGENT_COMMAND`",
    "serve": "`arbiter serve --resume --results {results} [the same options]`",
}


def resume_command(command: str | None, results: str = "DIR") -> str:
    """The resume command of an evaluation run by ``command`` ("run", "serve") into the folder
    ``results``; for another (a hosted attempt, or a folder written before the command was
    recorded) both, as it was run."""
    found = RESUME_COMMANDS.get(command or "")
    if found is None:
        return "`arbiter run --resume` or `arbiter serve --resume` (as it was run, with the same options)"
    return found.format(results=results)
