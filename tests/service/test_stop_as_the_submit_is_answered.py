"""A stop signal that comes once the evaluator has taken the agent's ENV_SUBMIT, and before its
reply has gone out: the evaluation has ended as the submit ended it, and the agent still gets
that reply at once, never left to wait out its reply timeout (F12)."""

from __future__ import annotations

import signal
import threading
import time

from harness import play_episode, read_summary, spec

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.protocol.messages import FLATLAND_RL
from arbiter.server.service.build import build_service
from arbiter.server.service.loop import STOP_SIGNALS

REPLY_TIMEOUT_S = 20.0  # what the submit would wait without its reply


def test_a_stop_as_the_submit_is_answered_sends_its_reply(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "results")
    service = build_service(spec(), tests=tiny_tests, results_dir=results, redis_url=redis_url, service_id=service_id)
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    outcome: dict = {}
    try:
        service.install_signal_handlers()
        submit = service.dispatch[FLATLAND_RL.ENV_SUBMIT]

        def submit_then_stopped(payload, now):
            answer = submit(payload, now)
            signal.raise_signal(signal.SIGTERM)  # the stop comes with the submit's reply on its way
            return answer

        service.dispatch[FLATLAND_RL.ENV_SUBMIT] = submit_then_stopped

        def agent() -> None:
            client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=REPLY_TIMEOUT_S,
                                  resend_after_s=0.2)  # fmt: skip
            try:
                while client.env_create()[0]:
                    play_episode(client, client.episode_index)
                outcome["reply"] = client.submit()
            except Exception as exc:  # what the test looks at
                outcome["error"] = exc
            outcome["at"] = time.monotonic()

        playing = threading.Thread(target=agent)
        playing.start()
        summary = service.run()
        ended = time.monotonic()
        service.close()
        playing.join(timeout=REPLY_TIMEOUT_S + 5)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert summary["state"] == "SUCCESS" and read_summary(results)["state"] == "SUCCESS"
    assert "error" not in outcome, outcome
    assert outcome["reply"]["mean_normalized_reward"] == round(summary["score"]["primary"], 5)
    assert outcome["at"] - ended < 1.0
    assert redis_conn.llen(keys.errors_key(service_id)) == 0  # nothing left for a later agent
