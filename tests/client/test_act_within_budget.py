"""``RemoteClient.act_within_budget``: a slow policy costs a step's quality, never the episode.

The policies here are slow on purpose (they sleep or spin past the budget); what the evaluator
did in answer is read from its counters and records once the steps are confirmed or handled.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
from harness import finish, read_episodes, running_service, seeded_actions, spec, wait_for

from arbiter.client import RemoteClient, TimeoutException
from arbiter.client.deadline_guard import BudgetClock, DeadlineGuard
from arbiter.protocol import keys

pytestmark = pytest.mark.alone  # policies timed against sub-second budgets

FALLBACK = {0: 4, 1: 4}  # both agents STOP_MOVING


def test_a_policy_slow_on_some_steps_plays_the_episode_with_no_timeout(redis_url, service_id, tiny_tests, tmp_path):
    step_s = 0.5
    slow_steps = {3: "sleeps", 7: "spins", 11: "spins"}
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=2, step_s=step_s, max_episodes=1),
        tests=tiny_tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        fell_back: list[int] = []
        guarded_s: dict[int, float] = {}

        def policy(step: int) -> dict[int, int]:
            if slow_steps.get(step) == "sleeps":
                time.sleep(10)
            elif slow_steps.get(step) == "spins":
                try:
                    while True:  # pure Python, and it catches every Exception: still stopped
                        pass
                except Exception:
                    pass
            return seeded_actions(0, step, 2)

        def fallback(step: int) -> dict[int, int]:
            fell_back.append(step)
            return FALLBACK

        client.env_create()
        step = 0
        while True:
            started = time.monotonic()
            actions = client.act_within_budget(policy, step, fallback=fallback)
            guarded_s[step] = time.monotonic() - started
            if client.env_step(actions)[2]["__all__"]:
                break
            step += 1
        client.submit()
        summary = finish(outcome)
    assert fell_back == sorted(slow_steps)
    assert client.fallbacks_used == len(slow_steps)
    assert all(guarded_s[s] < step_s for s in slow_steps)  # stopped inside the budget
    episode = read_episodes(results)[0]
    assert not episode["timed_out"] and episode["steps"] == step + 1
    assert episode["step_think_s"]["max"] < step_s
    assert "step_timeouts" not in summary["counters"]


def test_with_a_time_bank_the_guard_lets_the_policy_use_it_then_falls_back(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    step_s, bank_s = 0.3, 0.6
    results = str(tmp_path / "r")
    with running_service(
        spec(planning_s=2, step_s=step_s, time_bank_s=bank_s, max_episodes=1),
        tests=tiny_tests,
        results=results,
        redis_url=redis_url,
        service_id=service_id,
    ) as (service, outcome):
        evaluation = service.evaluation
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        fell_back: list[int] = []

        def policy(step: int, think_s: float) -> dict[int, int]:
            time.sleep(think_s)
            return seeded_actions(0, step, 2)

        def guarded_step(step: int, think_s: float) -> None:
            actions = client.act_within_budget(
                policy, step, think_s, fallback=lambda step, _: fell_back.append(step) or FALLBACK
            )
            client.env_step(actions)
            wait_for(lambda: evaluation.current.steps == step + 1, what=f"step {step} applied")

        client.env_create()
        guarded_step(0, 0.0)
        guarded_step(1, 0.45)  # 0.15 s over the budget: the bank pays, the policy's action goes out
        guarded_step(2, 0.45)
        assert fell_back == [] and evaluation.counters["step_timeouts"] == 0
        left_s = evaluation.bank.left_s
        assert 0 < left_s <= bank_s - 0.3
        without_bank_s = client.time_left_s(use_time_bank=False)
        assert client.time_left_s(use_time_bank=True) - without_bank_s <= left_s  # the client errs safe
        guarded_step(3, 10.0)  # far too slow for what is left: the fallback goes out in time
        assert fell_back == [3] and evaluation.counters["step_timeouts"] == 0
        assert not evaluation.records  # the episode is still running
        # The next step, not sent within the budget and the little left in the bank, times out.
        errors = keys.errors_key(service_id)
        wait_for(lambda: redis_conn.llen(errors), timeout_s=5, what="the step timeout posted")
        with pytest.raises(TimeoutException):
            client.env_step(seeded_actions(0, 4, 2))
        client.submit()
        finish(outcome)
    episode = read_episodes(results)[0]
    assert episode["timed_out"] and episode["timeout"] == "step" and episode["steps"] == 4
    assert episode["time_bank_used_s"] == bank_s


def test_off_the_main_thread_the_guard_stops_waiting_and_never_overlaps_calls():
    guard = DeadlineGuard()
    release = threading.Event()
    calls: list[str] = []

    def slow() -> str:
        calls.append("slow")
        release.wait(10)
        return "late"

    def quick() -> str:
        calls.append("quick")
        return "action"

    found: dict = {}

    def in_a_thread() -> None:
        started = time.monotonic()
        found["slow"] = guard.call(0.2, slow, ())
        found["slow_s"] = time.monotonic() - started
        found["while_abandoned"] = guard.call(0.2, quick, ())
        release.set()
        wait_for(lambda: not guard._abandoned.is_alive(), what="the abandoned call to end")
        found["after"] = guard.call(0.2, quick, ())

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join(timeout=10)
    assert found["slow"] == (False, None) and 0.2 <= found["slow_s"] < 1.0
    assert found["while_abandoned"] == (False, None)  # not called while the slow one runs on
    assert found["after"] == (True, "action")
    assert calls == ["slow", "quick"]


def test_the_guard_keeps_an_alarm_of_the_agents_own_and_passes_errors_through():
    guard = DeadlineGuard()
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    outer_delay_s, outer_interval_s = signal.getitimer(signal.ITIMER_REAL)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        assert guard.call(0.1, time.sleep, (5,)) == (False, None)
        delay_s, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.3 < delay_s <= 0.5  # the agent's alarm is still set, for what was left of it
        wait_for(lambda: fired, what="the agent's own alarm")
        with pytest.raises(ValueError, match="bad observation"):
            guard.call(1.0, int, ("bad observation",))
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer_delay_s:  # pytest-timeout's own alarm, when it uses signals
            signal.setitimer(signal.ITIMER_REAL, outer_delay_s, outer_interval_s)
    assert fired == [signal.SIGALRM]


def test_the_budget_clock_follows_the_announced_budgets_and_none_without_them():
    clock = BudgetClock()
    assert clock.time_left_s(use_time_bank=True) is None
    clock.episode_started({}, time.monotonic())  # flatland's own evaluator announces no budgets
    assert clock.time_left_s(use_time_bank=True) is None
    started = time.monotonic()
    clock.episode_started({"planning_s": 10.0, "step_s": 1.0, "time_bank_s": 2.0}, started)
    assert 11.9 < clock.time_left_s(use_time_bank=True) <= 12.0
    clock.step_sent(started + 10.5)  # planning ran 0.5 s over: drawn from the bank
    assert clock.time_left_s(use_time_bank=False) == pytest.approx(11.5, abs=0.1)
    bank_left_s = clock.time_left_s(use_time_bank=True) - clock.time_left_s(use_time_bank=False)
    assert bank_left_s == pytest.approx(1.5, abs=1e-3)
