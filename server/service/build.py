"""Assembles one evaluator from a competition spec: the format's plan and rule, results, service."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import redacted
from arbiter.server.core.competition import CompetitionSpec, setting_differences
from arbiter.server.core.evaluation import Evaluation
from arbiter.server.core.folder_digest import folder_digest
from arbiter.server.core.resume import restore, resume_point
from arbiter.server.core.scoring import scoring_rule
from arbiter.server.core.seeds import record_seed, refuse_changed_tests
from arbiter.server.formats import get_format
from arbiter.server.service.endings_told import answer_after_end, ended_unasked, withdraw_stop_notices
from arbiter.server.service.events import (
    EventLog,
    chain,
    first_start_recorded,
    replays_recorded,
    resumes_recorded,
)
from arbiter.server.service.loop import EvaluatorService
from arbiter.server.service.results import ResultsStore
from arbiter.server.service.service_claim import ServiceClaim
from arbiter.server.service.transport import DEFAULT_OUTAGE_LIMIT_S, EVALUATOR_WINDOW_US, RedisTransport
from arbiter.server.service.unsaid_withdrawals import unsaid_withdrawal

if TYPE_CHECKING:  # the lines a person watching reads: the command line's, handed in by it
    from arbiter.server.cli.progress import Progress


def build_service(
    spec: CompetitionSpec,
    *,
    tests: str | None,
    results_dir: str,
    redis_url: str,
    service_id: str,
    on_episode: Callable[[dict[str, Any], Evaluation], None] | None = None,
    resume: bool = False,
    redis_outage_s: float = DEFAULT_OUTAGE_LIMIT_S,
    poll_window_us: float = EVALUATOR_WINDOW_US,
    redis_private: bool = False,
    command: str | None = None,
) -> EvaluatorService:
    """An evaluator for one evaluation. With ``resume``, a killed evaluation continues after its
    last finished episode, and the Redis lists are kept: a client may be waiting on them.
    ``poll_window_us``: how long it polls for the agent's next request before sleeping (0: never).

    Around the evaluation: the format's recorder (``spec.record_episodes``) wraps the plan, and the
    event log hears of every finished episode and of the end; both see an episode after it is
    in ``episodes.jsonl``, the replay before the event that announces it. ``command``: what runs
    it ("run", "serve"; None: a hosted attempt), recorded, so that messages name its resume."""
    keys.validate_service_id(service_id)
    found = get_format(spec.format)
    if spec.record_episodes and found.recorder is None:
        raise ConfigError(f"format {spec.format!r} has no recorder: --record (record_episodes) is not available for it")
    rule = scoring_rule(spec.format, spec.scoring, spec.options)
    plan = found.make_plan(spec, rule, tests=tests)
    store = ResultsStore(results_dir, plan.csv_columns, plan.csv_row)
    store.command = command
    previous = store.previous_summary() if resume else None
    if previous is not None and previous.get("state") in ("SUCCESS", "FAILED"):
        raise ConfigError(
            f"the evaluation in {results_dir} already ended ({previous['state']}: {previous.get('termination_cause')});"
            " nothing to resume"
        )
    # Read only until the claim is taken: a folder this resume refuses (damaged, another
    # evaluation's settings or plan, or served by a running evaluator) is left as it was.
    earlier = store.read_for_resume() if resume else []
    # An evaluation that started before (its events say so) continues, even with no item finished:
    # its agent may be inside the first one.
    continues = resume and (bool(earlier) or os.path.exists(store.events_path))
    # What the test folder holds: kept with the seed, checked by a resume, in the summary.
    tests_digest = folder_digest(tests) if tests else None
    if continues:
        refuse_other_settings(first_start_recorded(store.events_path), spec, rule.name)
        resume_point(earlier, plan.items)  # the plan's items, or refused
        refuse_changed_tests(results_dir, tests_digest)  # they are, but the folder holds other episodes now
    transport = RedisTransport(redis_url, service_id, outage_limit_s=redis_outage_s, spin_us=poll_window_us)
    # Before anything is written or cleared: another evaluator serving this service id here is
    # left alone, and this one refused (a Redis not up yet is ridden out, as every call is).
    claim = ServiceClaim(redis_url, service_id)
    unsaid: dict[str, Any] | None = None  # a withdrawal a killed run made and never told of
    try:
        claim.take(transport)
    except BaseException:
        transport.redis.close()
        raise
    try:
        records = store.load_for_resume() if resume else []  # the torn tail cut, the table rebuilt
        if not resume:
            store.start_fresh()
            record_seed(results_dir, spec, tests, tests_digest)
        # Without recording the plan is used as it is: not even a wrapper on the step path.
        recorder = found.recorder(plan, store, spec.record_episodes) if spec.record_episodes else None
        events = EventLog(path=store.events_path, redis_url=redis_url, service_id=service_id)
        try:
            evaluation = Evaluation(
                recorder or plan,
                rule,
                spec.budgets,
                store,
                competition=spec.name,
                service_id=service_id,
                format_name=spec.format,
                options=spec.options_dict(),
                debug=spec.debug,
                on_episode=chain(recorder.episode_ended if recorder else None, events.episode, on_episode),
                on_finish=events.finished,
                on_replay=events.replayed,
            )
            evaluation.tests_digest = tests_digest
            if continues:
                restore(evaluation, records, earlier=previous)
                evaluation.counters["resumed"] = resumes_recorded(store.events_path) + 1  # killed runs' too
                evaluation.replayed = replays_recorded(store.events_path)  # this run's come after
                found = unsaid_withdrawal(store.replayed_path, store.episodes_path, evaluation.replayed)
                if found is not None and found["items"][-1] < evaluation.total:
                    unsaid = {"items": found["items"], "group": evaluation.items[found["items"][0]].group, **found}
                    evaluation.replayed.append(unsaid)  # a killed run's, said now (unsaid_withdrawals.py)
            if not resume:
                transport.clear()  # the events stream too: a watcher sees this evaluation only
            else:
                withdraw_stop_notices(transport)  # the evaluation goes on (endings_told.py)
            # The service counts what is queued as sent to an earlier evaluator (dropped, a live client
            # sends it again): counted before the started event, so a request sent once the event is
            # out is handled, never taken for a leftover and left for the client's resend.
            service = EvaluatorService(
                evaluation, transport, accept_pickle=spec.accept_pickle, redis_private=redis_private
            )
        except BaseException:
            events.close()
            raise
        events.started(evaluation, resumed=resume, record_episodes=spec.record_episodes, command=command)
        if unsaid is not None:
            events.replayed(unsaid)
    except BaseException:
        claim.release()
        raise
    service.claim = claim
    service.events = events
    claim.keep(on_lost=service.request_stop)
    return service


def refuse_other_settings(first: dict[str, Any] | None, spec: CompetitionSpec, rule_name: str) -> None:
    """A resume goes on under the settings its evaluation started with (its first ``started``
    event), or not at all: items played under other budgets or format keys would not score as one
    evaluation. ``ConfigError`` naming each difference."""
    if first is None:
        return
    now = json.loads(json.dumps({
        "competition": spec.name, "scoring": rule_name, "debug": spec.debug,
        "budgets": spec.budgets.as_dict(), "options": spec.options_dict(),
    }))  # fmt: skip
    said = [
        f"{name} {recorded!r} (given now: {wanted!r})" for name, wanted, recorded in setting_differences(now, first)
    ]
    if said:
        raise ConfigError(
            f"--resume: the evaluation started under other settings than these: {'; '.join(said)}; resume it "
            "with the options it started with"
        )


def start_service(
    spec: CompetitionSpec,
    *,
    tests: str | None,
    results_dir: str,
    redis_url: str,
    service_id: str,
    progress: Progress,
    resume: bool = False,
    redis_outage_s: float = DEFAULT_OUTAGE_LIMIT_S,
    on_stop_signal: Callable[[int], None] | None = None,
    redis_label: str | None = None,
    poll_window_us: float = EVALUATOR_WINDOW_US,
    redis_private: bool = False,
    command: str | None = None,
    agent_if_done: bool = True,
) -> EvaluatorService:
    """A service ready to run in the main thread: signals handled (each one also given to
    ``on_stop_signal``, from the signal handler), progress announced (the Redis by ``redis_label``
    if given, else by its URL with any password hidden). ``redis_private``: see EvaluatorService.
    ``agent_if_done`` False: a resume with every item on record (``everything_on_record``) waits for no
    agent, and its start line says none."""
    service = build_service(
        spec,
        tests=tests,
        results_dir=results_dir,
        redis_url=redis_url,
        service_id=service_id,
        on_episode=progress.episode,
        resume=resume,
        redis_outage_s=redis_outage_s,
        poll_window_us=poll_window_us,
        redis_private=redis_private,
        command=command,
    )
    service.install_signal_handlers(also=on_stop_signal)
    # Everything loaded so far (flatland, numpy, the test set's index) lives as long as the
    # process: moved out of the collector's sight, the full collection after each episode
    # (formats/flatland) scans only what episodes allocate, well under a millisecond.
    gc.freeze()
    progress.started(
        service_id=service_id,
        tests=service.evaluation.plan.source,
        episodes=service.evaluation.total,
        on_record=len({record["index"] for record in service.evaluation.records}),  # a resume's
        nouns=service.evaluation.plan.item_nouns,
        competition=spec.name,
        debug=spec.debug,
        redis=redis_label or redacted(redis_url),
        agent=agent_if_done or not (resume and everything_on_record(service.evaluation)),
    )
    return service


def everything_on_record(evaluation: Evaluation) -> bool:
    """Every item is on record and the evaluation has not ended: what a resume of one killed after
    its last item and before its summary finds."""
    return evaluation.next_index >= evaluation.total and not evaluation.finished


def run_to_end(
    service: EvaluatorService,
    progress: Progress,
    results_dir: str,
    answer_after_end_s: float = 0.0,
    *,
    agent_watched: bool = True,
) -> dict[str, Any]:
    """Serve until the evaluation ends, then show the results table; returns the summary.
    ``answer_after_end_s``: for that long after the end (or until the local agent exits), every
    request gets an error that says how the evaluation ended. ``agent_watched`` False (``serve``:
    the agent is another process's, its exit unknown here): only after an ending the agent did
    not ask for, and only until one request has been answered so."""
    try:
        summary = service.run()
        progress.finished(summary, service.evaluation, results_dir)
        # Unwatched, an agent is waited for only if one came, and it did not ask for the ending.
        came = service.gate.owner is not None
        tell = agent_watched or (came and ended_unasked(service.transport, service.evaluation))
        if answer_after_end_s > 0 and service.ended_at is not None and tell:
            answer_after_end(service, until=service.ended_at + answer_after_end_s, until_told=not agent_watched)
    finally:
        service.close()
    return summary
