"""Flatland's legacy wire: what flatland-rl's own client sends and expects, kept apart from
arbiter's msgpack protocol.

- ``safe_pickle`` and ``pickle_scan``: pickled requests (``use_pickle=True``), decoded by a
  restricted unpickler after an opcode scan, never by ``pickle`` itself;
- ``envstate``: env state (Flatland's env objects) as plain msgpack-safe data, rebuilt only from
  an allowlist of classes;
- ``flatland_env``: how both sides build and reward a Flatland episode.
"""
