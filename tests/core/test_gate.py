"""server/core/gate.py: who may talk to an evaluation, and exactly-once handling of what they send.

The gate is driven here as the service loop drives it: ``admit`` for every request (with the
arbiter extension of its payload and the loop's clock), ``remember`` with the reply of every
request it let through. The end-to-end behaviour over Redis is in tests/service/test_takeover.py
and tests/service/test_fault_clients.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from arbiter.protocol.errors import ClientConflict
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL
from arbiter.server.core.gate import LEGACY, ClientGate, Verdict, other_client_reply

TAKEOVER_AFTER_S = 0.5


def tagged(session: str, seq: int) -> dict[str, Any]:
    return {"session": session, "seq": seq}


@pytest.fixture
def gate() -> ClientGate:
    return ClientGate(lambda: TAKEOVER_AFTER_S)


def test_only_a_handshake_binds_an_unbound_evaluation(gate):
    step = gate.admit(tagged("a", 1), 0.0, handshake=False)
    assert step.verdict is Verdict.UNBOUND and gate.owner is None
    ping = gate.admit(tagged("a", 2), 0.1, handshake=True)
    assert ping.verdict is Verdict.APPLY and ping.bound and gate.owner == "a"
    follow_up = gate.admit(tagged("a", 3), 0.2, handshake=False)
    assert follow_up.verdict is Verdict.APPLY and not follow_up.bound


def test_a_resend_is_answered_from_the_cached_reply_and_an_older_request_is_dropped(gate):
    first = gate.admit(tagged("a", 1), 0.0, handshake=True)
    gate.remember(first, {"type": FLATLAND_RL.PONG, "payload": {"n": 1}})
    second = gate.admit(tagged("a", 2), 0.1, handshake=False)
    gate.remember(second, {"type": FLATLAND_RL.ENV_STEP_RESPONSE, "payload": {"n": 2}})
    again = gate.admit(tagged("a", 2), 0.2, handshake=False)
    assert again.verdict is Verdict.RESEND
    assert again.cached_reply == {"type": FLATLAND_RL.ENV_STEP_RESPONSE, "payload": {"n": 2}}
    assert gate.admit(tagged("a", 1), 0.3, handshake=False).verdict is Verdict.STALE


def test_a_gap_in_the_sequence_is_applied_and_counts_the_missing_requests(gate):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    jump = gate.admit(tagged("a", 5), 0.1, handshake=False)
    assert jump.verdict is Verdict.APPLY and jump.lost == 3 and jump.seq == 5


def test_another_client_is_refused_while_the_bound_one_is_heard_from(gate):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    handshake = gate.admit(tagged("b", 1), 0.2, handshake=True)
    assert handshake.verdict is Verdict.FOREIGN
    assert handshake.retry_after_s == pytest.approx(TAKEOVER_AFTER_S - 0.2)
    step = gate.admit(tagged("b", 2), 0.3, handshake=False)
    assert step.verdict is Verdict.FOREIGN and step.retry_after_s is None
    assert gate.owner == "a"


def test_a_handshake_takes_over_from_a_client_silent_longer_than_the_window(gate):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    gate.remember(gate.admit(tagged("a", 2), 1.0, handshake=False), None)
    # Silent exactly as long as the window: not yet.
    assert gate.admit(tagged("b", 1), 1.0 + TAKEOVER_AFTER_S, handshake=True).verdict is Verdict.FOREIGN
    takeover = gate.admit(tagged("b", 1), 1.0 + TAKEOVER_AFTER_S + 0.01, handshake=True)
    assert takeover.verdict is Verdict.APPLY and takeover.bound
    assert takeover.took_over_after_s == pytest.approx(TAKEOVER_AFTER_S + 0.01)
    assert gate.owner == "b"
    # The new client's numbering starts afresh: its seq 1 is neither stale nor a resend of a's.
    gate.remember(takeover, None)
    assert gate.admit(tagged("b", 2), 2.0, handshake=False).verdict is Verdict.APPLY
    # And the client that was replaced is now the foreign one.
    assert gate.admit(tagged("a", 3), 2.1, handshake=False).verdict is Verdict.FOREIGN


def test_the_window_is_read_at_each_request():
    window = {"s": 10.0}
    gate = ClientGate(lambda: window["s"])
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    assert gate.admit(tagged("b", 1), 1.0, handshake=True).verdict is Verdict.FOREIGN
    window["s"] = 0.5  # the running episode's budgets shrank the window (between episodes)
    assert gate.admit(tagged("b", 1), 1.0, handshake=True).verdict is Verdict.APPLY


def test_a_client_without_session_is_the_legacy_client_and_is_applied_as_it_comes(gate):
    first = gate.admit({}, 0.0, handshake=True)
    assert first.verdict is Verdict.APPLY and gate.owner == LEGACY and first.seq is None
    gate.remember(first, {"reply": 1})
    # No sequence numbers: the same request twice is applied twice, never answered from a cache.
    assert gate.admit({}, 0.1, handshake=False).verdict is Verdict.APPLY
    assert gate.admit({}, 0.2, handshake=False).verdict is Verdict.APPLY


@pytest.mark.parametrize(
    "ext",
    [{"session": "", "seq": 1}, {"session": "x" * 65, "seq": 1}, {"session": 7, "seq": 1}, {"session": ["a"]}],
)
def test_a_session_id_that_is_not_a_short_string_counts_as_the_legacy_client(gate, ext):
    admission = gate.admit(ext, 0.0, handshake=True)
    assert admission.verdict is Verdict.APPLY and gate.owner == LEGACY


@pytest.mark.parametrize("seq", [True, "3", 2.0, None])
def test_a_sequence_number_that_is_not_an_integer_is_applied_without_exactly_once(gate, seq):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), {"reply": 1})
    admission = gate.admit({"session": "a", "seq": seq}, 0.1, handshake=False)
    assert admission.verdict is Verdict.APPLY and admission.seq is None


def test_rejoin_lets_the_first_request_of_an_arbiter_client_bind_but_only_once():
    gate = ClientGate(lambda: TAKEOVER_AFTER_S, rejoin=True)
    # A legacy client's stray step still cannot bind a resumed evaluation.
    assert gate.admit({}, 0.0, handshake=False).verdict is Verdict.UNBOUND
    step = gate.admit(tagged("survivor", 41), 0.1, handshake=False)
    assert step.verdict is Verdict.APPLY and step.bound and gate.owner == "survivor"
    gate.remember(step, None)
    # Once bound, the usual rules: another client's step is foreign.
    assert gate.admit(tagged("other", 1), 0.2, handshake=False).verdict is Verdict.FOREIGN


def test_rejoin_is_spent_once_a_client_bound():
    gate = ClientGate(lambda: TAKEOVER_AFTER_S, rejoin=True)
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    # After a takeover the gate is bound again, and a stray step of someone else stays foreign.
    takeover = gate.admit(tagged("b", 1), 5.0, handshake=True)
    assert takeover.verdict is Verdict.APPLY
    assert gate.admit(tagged("c", 1), 5.1, handshake=False).verdict is Verdict.FOREIGN


def test_the_other_client_refusal_names_its_code_and_when_to_retry(gate):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    handshake_reply = other_client_reply(gate.admit(tagged("b", 1), 0.1, handshake=True))
    assert handshake_reply["type"] == FLATLAND_RL.ERROR
    assert handshake_reply["payload"]["code"] == ClientConflict.code
    assert handshake_reply["payload"][EXTENSION_KEY]["retry_after_s"] == pytest.approx(TAKEOVER_AFTER_S - 0.1)
    step_reply = other_client_reply(gate.admit(tagged("b", 2), 0.2, handshake=False))
    assert step_reply["payload"]["code"] == ClientConflict.code and EXTENSION_KEY not in step_reply["payload"]


def test_a_client_told_to_restart_can_be_replaced_at_once(gate):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    gate.yield_to_successor()  # its request was answered EvaluatorRestarted
    # Sending that request again (its reply was lost) only asks again: the yield stands.
    assert gate.admit(tagged("a", 1), 0.05, handshake=False).verdict is Verdict.RESEND
    # Its restarted agent's handshake, long before TAKEOVER_AFTER_S of silence: it takes over.
    takeover = gate.admit(tagged("b", 1), 0.1, handshake=True)
    assert takeover.verdict is Verdict.APPLY and takeover.bound and gate.owner == "b"
    assert takeover.took_over_after_s == pytest.approx(0.05)
    # The new client is bound as any other: a third one waits for its silence.
    gate.remember(takeover, None)
    assert gate.admit(tagged("c", 1), 0.2, handshake=True).verdict is Verdict.FOREIGN


def test_a_client_told_to_restart_that_goes_on_keeps_the_evaluation(gate):
    gate.remember(gate.admit(tagged("a", 1), 0.0, handshake=True), None)
    gate.yield_to_successor()
    # A runner rebuilds its agent and sends its next request: the evaluation stays its own.
    assert gate.admit(tagged("a", 2), 0.1, handshake=True).verdict is Verdict.APPLY
    assert gate.admit(tagged("b", 1), 0.2, handshake=True).verdict is Verdict.FOREIGN
