"""Assembles one evaluator from a competition spec: adapter, scoring rule, results, service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arbiter.protocol import keys

from .adapters import ADAPTERS
from .competition import CompetitionSpec
from .evaluation import Evaluation
from .progress import Progress
from .results import ResultsStore
from .scoring import scoring_rule
from .service import EvaluatorService
from .transport import RedisTransport


def build_service(
    spec: CompetitionSpec,
    *,
    tests: str,
    results_dir: str,
    redis_url: str,
    service_id: str,
    on_episode: Callable[[dict[str, Any], Evaluation], None] | None = None,
) -> EvaluatorService:
    keys.validate_service_id(service_id)
    adapter = ADAPTERS[spec.adapter](tests, seed=spec.seed, max_episodes=spec.max_episodes)
    store = ResultsStore(results_dir, adapter.metadata_columns, adapter.metadata)
    store.start_fresh()
    evaluation = Evaluation(
        adapter,
        scoring_rule(spec.scoring),
        spec.budgets,
        store,
        competition=spec.name,
        service_id=service_id,
        debug=spec.debug,
        on_episode=on_episode,
    )
    transport = RedisTransport(redis_url, service_id)
    transport.clear()
    return EvaluatorService(evaluation, transport)


def start_service(
    spec: CompetitionSpec, *, tests: str, results_dir: str, redis_url: str, service_id: str, progress: Progress
) -> EvaluatorService:
    """A service ready to run in the main thread: signals handled, progress announced."""
    service = build_service(
        spec,
        tests=tests,
        results_dir=results_dir,
        redis_url=redis_url,
        service_id=service_id,
        on_episode=progress.episode,
    )
    service.install_signal_handlers()
    progress.started(
        service_id=service_id,
        tests=tests,
        episodes=service.evaluation.total,
        competition=spec.name,
        debug=spec.debug,
        redis=redis_url,
    )
    return service


def run_to_end(service: EvaluatorService, progress: Progress, results_dir: str) -> dict[str, Any]:
    """Serve until the evaluation ends, then show the results table; returns the summary."""
    try:
        summary = service.run()
    finally:
        service.transport.close()
    progress.finished(summary, service.evaluation.records, results_dir)
    return summary
