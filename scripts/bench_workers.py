"""The measured processes of the Flatland benchmark, one per ``scripts/bench.py --worker MODE``.

Each imports what it needs first and then measures itself, so import time never counts; it prints
its result as one line (harness.emit) that the orchestrator reads from its log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

from bench_flatland import EVAL_SEED, HOST, agent_actions, arrived_count, step_stats, vm_rss_kib
from harness import emit


def time_calls(owner: Any, name: str, sink: list[float], wanted: Callable[..., bool] = lambda *a, **k: True) -> None:
    """Wrap the public method ``owner.name`` on this one instance (no library code changes) so
    that the duration of each wanted call is appended to ``sink``."""
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if not wanted(*args, **kwargs):
            return original(*args, **kwargs)
        before = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - before)

    setattr(owner, name, timed)


def _result(path: str, started_epoch: float, wall: float, episodes: list, steps: list, local: list, **extra: Any):
    return {
        "path": path,
        "wall_s": wall,
        "start_epoch": started_epoch,
        "end_epoch": started_epoch + wall,
        "episodes": episodes,
        "step_s": step_stats(steps),
        "local_step_s": step_stats(local),
        **extra,
    }


def worker_direct(args: argparse.Namespace) -> int:
    from flatland.core.env_observation_builder import DummyObservationBuilder
    from flatland.envs.persistence import RailEnvPersister

    def load(path: str) -> Any:
        env, _ = RailEnvPersister.load_new(path, obs_builder=DummyObservationBuilder())
        return env

    return play_in_process("direct", load, args)


def lean_loader() -> Callable[[str], Any]:
    """What loads an env as arbiter's client builds it for the evaluation ``arbiter serve`` runs by
    default: the competition's rewards, no step recorder, the distance map computed when first read."""
    from flatland.core.env_observation_builder import DummyObservationBuilder
    from flatland.envs.persistence import RailEnvPersister

    from arbiter.protocol.legacy.flatland_env import build_rail_env, rewards_for
    from arbiter.server.core.competition import load_competition
    from arbiter.server.formats import get_format

    spec = load_competition()
    reward_model = get_format(spec.format).rules[spec.scoring](spec.options).reward_model

    def load(path: str) -> Any:
        env_dict = RailEnvPersister.load_env_dict(path)
        return build_rail_env(
            env_dict, obs_builder=DummyObservationBuilder(), rewards=rewards_for(reward_model), record_steps=False
        )

    return load


def worker_lean(args: argparse.Namespace) -> int:
    return play_in_process("lean", lean_loader(), args)


def _play_episode(env: Any, step: Callable[[Any], tuple], index: int, name: str, step_times: list[float]) -> dict:
    """Episode ``index`` on ``env`` to its end, each action through ``step`` (timed into ``step_times``)."""
    clock = time.perf_counter
    num_agents = env.get_num_agents()
    steps = 0
    while True:
        actions = agent_actions(index, steps, num_agents)
        before = clock()
        _, _, dones, _ = step(actions)
        step_times.append(clock() - before)
        steps += 1
        if dones["__all__"]:
            return {"env": name, "agents": num_agents, "steps": steps, "arrived": arrived_count(env)}


def play_in_process(
    path_name: str,
    load: Callable[[str], Any],
    args: argparse.Namespace,
    stepper: Callable[[Any, int], Callable[[Any], tuple]] = lambda env, index: env.step,
    finish: Callable[[], None] = lambda: None,
) -> int:
    """The in-process loop over the test set; ``stepper(env, index)`` is what steps episode
    ``index`` (the env's own step by default), ``finish`` runs before the clock stops."""
    from flatland.envs.step_utils.states import TrainState  # noqa: F401 - imported before timing

    from arbiter.server.formats.flatland.generate import list_env_paths

    paths = list_env_paths(args.tests)
    step_times: list[float] = []
    creates: list[float] = []
    episodes = []
    rss: list[list[int]] = []
    clock = time.perf_counter
    started_epoch = time.time()
    started = clock()
    for index, rel in enumerate(paths):
        created = clock()
        env = load(os.path.join(args.tests, rel))
        env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=EVAL_SEED)
        creates.append(clock() - created)
        episodes.append(_play_episode(env, stepper(env, index), index, rel, step_times))
        if args.rss_self and (index == 0 or (index + 1) % args.rss_every == 0):
            rss.append([index + 1, vm_rss_kib(os.getpid()) or 0])
    finish()
    wall = clock() - started
    emit(
        _result(
            path_name,
            started_epoch,
            wall,
            episodes,
            step_times,
            step_times,
            create_s=creates,
            create_wait_s=[0.0] * len(creates),
            create_total_s=math.fsum(creates),
            final_create_s=0.0,
            submit_s=0.0,
            handshake_s=0.0,
            rss_kib=rss,
        )
    )
    return 0


def _play_remote(
    path: str, client: Any, create_waits: list[float], env_path: Callable[[], str], args: Any, handshake_s: float
) -> int:
    """The agent loop shared by both clients; ``create_waits`` gets the reply wait of every env_create."""
    from flatland.core.env_observation_builder import DummyObservationBuilder

    clock = time.perf_counter
    obs_builder = DummyObservationBuilder()
    step_times: list[float] = []
    local_times: list[float] = []
    creates: list[float] = []
    episodes = []
    rss: list[list[int]] = []
    index = 0
    final_create = 0.0
    started_epoch = time.time()
    started = clock()
    while True:
        created = clock()
        observation, _ = client.env_create(obs_builder_object=obs_builder)
        took = clock() - created
        if not observation:
            final_create = took  # the closing env_create: the evaluator drains the last episode first
            break
        creates.append(took)
        env = client.env
        time_calls(env, "step", local_times)  # the local env.step inside env_step
        episodes.append(_play_episode(env, client.env_step, index, env_path(), step_times))
        index += 1
        if args.rss_pid and (index == 1 or index % args.rss_every == 0):
            rss.append([index, vm_rss_kib(args.rss_pid) or 0])
    submitted = clock()
    scores = client.submit()
    end = clock()
    if args.rss_pid:
        rss.append([index, vm_rss_kib(args.rss_pid) or 0])
    emit(
        _result(
            path,
            started_epoch,
            end - started,
            episodes,
            step_times,
            local_times,
            create_s=creates,
            create_wait_s=create_waits[: len(creates)],
            create_total_s=math.fsum(creates),
            final_create_s=final_create,
            submit_s=end - submitted,
            handshake_s=handshake_s,
            scores=_jsonable(scores),
            rss_kib=rss,
        )
    )
    return 0


def worker_arbiter(args: argparse.Namespace) -> int:
    import flatland.core.env_observation_builder  # noqa: F401 - imported before timing

    from arbiter.client import RemoteClient
    from arbiter.protocol.messages import FLATLAND_RL

    before = time.perf_counter()
    client = RemoteClient(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=args.reply_timeout)
    handshake = time.perf_counter() - before
    waits: list[float] = []
    time_calls(client, "request", waits, lambda type_, *a, **k: type_ == FLATLAND_RL.ENV_CREATE)
    try:
        return _play_remote("arbiter", client, waits, lambda: str(client.current_env_path), args, handshake)
    finally:
        client.close()


def worker_flatland_client(args: argparse.Namespace) -> int:
    from flatland.evaluators import messages
    from flatland.evaluators.client import FlatlandRemoteClient

    before = time.perf_counter()
    client = FlatlandRemoteClient(
        test_env_folder=args.tests, flatland_rl_service_id=args.service_id, remote_host=HOST, remote_port=args.port
    )
    handshake = time.perf_counter() - before
    waits: list[float] = []
    # flatland-rl's client shows its wait for a reply nowhere else: its own request method
    time_calls(
        client,
        "_remote_request",
        waits,
        lambda request, *a, **k: request.get("type") == messages.FLATLAND_RL.ENV_CREATE,
    )
    rel = lambda: os.path.relpath(client.current_env_path, args.tests)  # noqa: E731
    return _play_remote("flatland", client, waits, rel, args, handshake)


def worker_flatland_service(args: argparse.Namespace) -> int:
    """flatland-rl's own evaluator, unmodified, as the main thread of this process."""
    from flatland.evaluators import messages
    from flatland.evaluators.service import FlatlandRemoteEvaluationService

    service = FlatlandRemoteEvaluationService(
        test_env_folder=args.tests,
        flatland_rl_service_id=args.service_id,
        remote_host=HOST,
        remote_port=args.port,
        result_output_path=args.results,
    )
    outcome = service.run()
    metadata = service.evaluation_metadata_df
    episodes = []
    for rel, steps, complete in zip(
        service.simulation_env_file_paths,
        service.simulation_steps,
        service.simulation_percentage_complete,
        strict=False,
    ):
        agents = int(metadata.loc[rel, "n_agents"])
        episodes.append({"env": rel, "agents": agents, "steps": int(steps), "arrived": round(complete * agents)})
    emit(
        {
            "outcome": outcome.get("type"),
            "server_step_mean_s": service.stats.get("internal_env_step_time_mean"),
            "server_step_max_s": service.stats.get("internal_env_step_time_max"),
            "server_steps": service.stats.get("internal_env_step_time_counter"),
            "episodes": episodes,
        }
    )
    return 0 if outcome.get("type") == messages.FLATLAND_RL.ENV_SUBMIT_RESPONSE else 1


def worker_proto_server(args: argparse.Namespace) -> int:
    """An evaluator-like loop without envs: arbiter's transport pops, arbiter's codec decodes."""
    from arbiter.protocol import codec
    from arbiter.protocol.messages import FLATLAND_RL, reply
    from arbiter.server.service.transport import RedisTransport

    transport = RedisTransport(args.redis_url, args.service_id)
    transport.clear()
    clock = time.perf_counter
    steps = 0
    decode_s = 0.0
    first_step = last_step = None
    try:
        while True:
            raw = transport.pop(time.monotonic() + args.idle_timeout)
            if raw is None:
                emit({"error": f"no request for {args.idle_timeout} s after {steps} steps"})
                return 1
            before = clock()
            message = codec.decode(raw, codec.COMMAND_LIMITS)
            decode_s += clock() - before
            kind = message.get("type")
            if kind == FLATLAND_RL.ENV_STEP:
                if first_step is None:
                    first_step = before
                last_step = clock()
                steps += 1
                message["payload"].get("action")
            elif kind == FLATLAND_RL.PING:
                transport.reply(message["response_channel"], codec.encode(reply(FLATLAND_RL.PONG, {})))
            elif kind == FLATLAND_RL.ENV_SUBMIT:
                transport.reply(
                    message["response_channel"], codec.encode(reply(FLATLAND_RL.ENV_SUBMIT_RESPONSE, {"steps": steps}))
                )
                break
    finally:
        transport.close()
    span = (last_step - first_step) if first_step is not None and last_step is not None else 0.0
    emit({"steps_read": steps, "decode_mean_s": decode_s / max(steps, 1), "server_span_s": span})
    return 0


class _NoEnv:
    """An env whose step costs nothing: RemoteClient.env_step then costs only what it sends."""

    def step(self, actions: dict[int, int]) -> tuple[dict, dict, dict, dict]:
        return {}, {}, {"__all__": False}, {}


def worker_proto_client(args: argparse.Namespace) -> int:
    """Empty ENV_STEP requests through ``RemoteClient.env_step``, its local env one that does nothing."""
    from arbiter.client import RemoteClient

    client = RemoteClient(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=args.reply_timeout)
    client.env = _NoEnv()  # no env_create: the evaluator here has no envs, it only reads the steps
    clock = time.perf_counter
    started = clock()
    for _ in range(args.n):
        client.env_step({})
    sent = clock()
    answer = client.submit()  # queued behind every step: answered once the server read them all
    done = clock()
    client.close()
    emit({"n": args.n, "send_s": sent - started, "elapsed_s": done - started, "steps_per_s": args.n / (done - started),
          "client_call_mean_s": (sent - started) / args.n, "server_steps": answer.get("steps")})  # fmt: skip
    return 0


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


WORKERS = {
    "direct": worker_direct,
    "lean": worker_lean,
    "arbiter": worker_arbiter,
    "flatland": worker_flatland_client,
    "flatland-service": worker_flatland_service,
    "proto-server": worker_proto_server,
    "proto-client": worker_proto_client,
}
