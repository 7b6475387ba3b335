"""A deterministic arbiter agent in a process of its own, for tests that kill agents for real.

    python seeded_agent_main.py REDIS_URL SERVICE_ID [--step-delay S [--slow-until FILE]]
                                [--hang-at EPISODE STEP MARKER]

Actions are ``harness.seeded_actions(episode, step, agents)``, so two runs that play the same
episodes score the same. ``--step-delay`` slows every step down; with ``--slow-until``, only
until FILE exists (the test lets the agent finish at full speed once it has seen what it waited
for). ``--hang-at`` makes the agent stop sending at that step of that episode, as a hung agent
does, after creating MARKER (the test awaits it, then kills the process). At the end it prints
the submit reply as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import seeded_actions  # noqa: E402

from arbiter.client import RemoteClient  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("redis_url")
parser.add_argument("service_id")
parser.add_argument("--step-delay", type=float, default=0.0)
parser.add_argument("--slow-until", metavar="FILE")
parser.add_argument("--hang-at", nargs=3, metavar=("EPISODE", "STEP", "MARKER"))
args = parser.parse_args()
hang_at = (int(args.hang_at[0]), int(args.hang_at[1])) if args.hang_at else None

client = RemoteClient(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=60, resend_after_s=0.3)
while client.env_create()[0]:
    step = 0
    while True:
        if (client.episode_index, step) == hang_at:
            with open(args.hang_at[2], "w") as handle:
                handle.write(str(os.getpid()))
            threading.Event().wait()  # hung until killed
        if args.step_delay and not (args.slow_until and os.path.exists(args.slow_until)):
            time.sleep(args.step_delay)
        if client.env_step(seeded_actions(client.episode_index, step, client.env.get_num_agents()))[2]["__all__"]:
            break
        step += 1
scores = client.submit()
print(json.dumps({"score": scores.get("score"), "score_secondary": scores.get("score_secondary")}), flush=True)
