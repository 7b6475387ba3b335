"""A hostile agent for the tenant tests: it floods its own evaluation's Redis as its own user,
pushing junk onto its reply lists and its commands list as fast as it can.

    python flood_agent_main.py SECONDS

It connects where its evaluation tells it (``ARBITER_REDIS_URL``, ``AICROWD_SUBMISSION_ID``),
keeps pushing through refusals (a full Redis refuses writes) for SECONDS or until stopped, and
prints how many pushes were taken and refused.
"""

from __future__ import annotations

import os
import sys
import time

import redis

from arbiter.protocol import keys

CHUNK = os.urandom(64 * 1024)
LISTS = 16

service_id = os.environ["AICROWD_SUBMISSION_ID"]
conn = redis.Redis.from_url(os.environ["ARBITER_REDIS_URL"], socket_timeout=10)
taken = refused = 0
until = time.monotonic() + float(sys.argv[1])
try:
    while time.monotonic() < until:
        pipe = conn.pipeline(transaction=False)
        for index in range(LISTS):
            pipe.lpush(keys.response_key(service_id, f"junk-{index}"), CHUNK)
            pipe.lpush(keys.commands_key(service_id), CHUNK)
        for answer in pipe.execute(raise_on_error=False):
            refused += isinstance(answer, Exception)
            taken += not isinstance(answer, Exception)
finally:
    print(f"flood: {taken} pushes taken, {refused} refused", flush=True)
