"""Assembles one evaluator from a competition spec: adapter, scoring rule, results, service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arbiter.protocol import keys

from .adapters import ADAPTERS
from .competition import CompetitionSpec
from .evaluation import Evaluation
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
