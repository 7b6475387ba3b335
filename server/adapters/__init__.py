"""Env adapters: how the evaluator makes, resets and steps one episode's env.

An adapter lists the evaluation's episodes and opens each one; an opened episode builds the
ENV_CREATE reply payload and applies actions. Adapters know nothing of Redis or msgpack.
"""

from .flatland import FlatlandEpisode, FlatlandTestFolder

ADAPTERS = {"flatland": FlatlandTestFolder}

__all__ = ["ADAPTERS", "FlatlandEpisode", "FlatlandTestFolder"]
