"""client/remote_env.py: ``RemoteEnv``, a gymnasium.Env whose env lives on the evaluator.

Every test plays against a real evaluator (two-phase on a counting env, whose observation is
[steps so far, reset seed % 1000] and whose reward is 1 per step plus 1 per action 1).
"""

from __future__ import annotations

import contextlib

import gymnasium
import numpy as np
import pytest
from fake_envs import counting_competition
from harness import finish, read_episodes, running_service

from arbiter.client.remote_env import RemoteEnv
from arbiter.protocol.errors import OutOfOrder, WrongFormat

PHASE2 = {"num_runs": 1, "max_steps": 20, "goal_reward": 9.0, "stability_window": 1}


@pytest.fixture
def serve(redis_url, service_id, tmp_path):
    """Start a counting evaluation with the given competition keys; yields a starter. Every
    evaluation started is stopped at the end of the test."""
    with contextlib.ExitStack() as running:

        def start(**keys):
            results = str(tmp_path / "results")
            service, outcome = running.enter_context(
                running_service(
                    counting_competition(**keys),
                    tests=None,
                    results=results,
                    redis_url=redis_url,
                    service_id=service_id,
                )  # fmt: skip
            )
            return service, outcome, results

        yield start


def connect(redis_url: str, service_id: str, **kwargs) -> RemoteEnv:
    return RemoteEnv(redis_url=redis_url, service_id=service_id, **{"reply_timeout_s": 10, **kwargs})


def test_the_spaces_come_from_the_evaluator(serve, redis_url, service_id):
    serve(num_episodes=1)
    env = connect(redis_url, service_id)
    assert isinstance(env, gymnasium.Env)
    assert env.action_space == gymnasium.spaces.Discrete(2)
    assert isinstance(env.observation_space, gymnasium.spaces.Box) and env.observation_space.shape == (2,)
    assert env.next_item == 0 and not env.finished
    env.close()


def test_an_episode_is_played_with_gymnasiums_signature(serve, redis_url, service_id):
    _, outcome, results = serve(num_episodes=1, length=3)
    env = connect(redis_url, service_id)
    observation, info = env.reset()
    assert observation[0] == 0 and info["env_done"] is False and info["arbiter"]["item"] == 0
    assert env.observation_space.contains(np.asarray(observation))
    steps = [env.step(1) for _ in range(3)]
    assert [float(obs[0]) for obs, *_ in steps] == [1.0, 2.0, 3.0]
    assert [reward for _, reward, *_ in steps] == [2.0, 2.0, 2.0]
    assert [terminated for _, _, terminated, _, _ in steps] == [False, False, True]
    assert not any(truncated for _, _, _, truncated, _ in steps)
    # Only the step that ends the episode names its seed: the one the evaluator reset with.
    assert "seed" not in steps[0][4]["arbiter"]
    assert steps[-1][4]["arbiter"]["seed"] % 1000 == observation[1]
    env.submit()
    env.close()
    assert finish(outcome)["state"] == "SUCCESS"
    assert [record["return"] for record in read_episodes(results)] == [6.0]


def test_a_seed_asked_for_seeds_np_random_only(serve, redis_url, service_id):
    """The evaluator chooses the episode's seed; the seed asked for seeds ``np_random`` as
    gymnasium.Env.reset does (what gymnasium's env checker asks of every env), and nothing else."""
    import numpy as np

    serve(num_episodes=1, length=1)
    env = connect(redis_url, service_id)
    with pytest.warns(UserWarning) as warned:
        observation, _ = env.reset(seed=123, options={"level": 3})
    assert [str(w.message) for w in warned] == [
        "the evaluator chooses every reset's seed; reset(seed=123) seeds np_random only",
        "the evaluator decides every episode; reset(options={'level': 3}) is ignored",
    ]
    assert env.np_random.integers(1 << 30) == np.random.default_rng(123).integers(1 << 30)
    *_, info = env.step(0)
    assert info["arbiter"]["seed"] % 1000 == observation[1]  # the evaluator's seed, whatever was asked
    env.close()


def test_a_step_before_a_reset_is_out_of_order_and_sends_nothing(serve, redis_url, service_id):
    service, outcome, _ = serve(num_episodes=1)
    env = connect(redis_url, service_id)
    with pytest.raises(OutOfOrder, match="before reset"):
        env.step(1)
    env.close()
    service.request_stop("the test is over")
    assert finish(outcome)["counters"].get("errors_out_of_order", 0) == 0


def test_once_no_episode_is_left_reset_says_env_done(serve, redis_url, service_id):
    _, outcome, _ = serve(num_episodes=1, length=1)
    env = connect(redis_url, service_id)
    env.reset()
    last_observation, *_ = env.step(1)
    observation, info = env.reset()
    assert info["env_done"] is True and env.finished
    assert np.array_equal(observation, last_observation)
    scores = env.submit()
    assert scores["score"] == 2.0
    env.close()
    assert finish(outcome)["state"] == "SUCCESS"


def test_another_formats_agent_is_refused(serve, redis_url, service_id):
    _, outcome, _ = serve(num_episodes=1)
    with pytest.raises(WrongFormat, match="two-phase"):
        connect(redis_url, service_id, formats=["metalc"])
    assert finish(outcome)["state"] == "FAILED"


def test_a_training_stage_ends_with_stop_iteration_and_the_evaluation_goes_on(serve, redis_url, service_id):
    _, outcome, results = serve(num_episodes=1, phase=2, phase2=PHASE2)
    env = connect(redis_url, service_id)
    train, evaluate = env.stages
    assert (train["stage"], evaluate["stage"]) == ("train", "eval")
    env.begin_stage(train)
    episodes = 0
    with pytest.raises(StopIteration):
        # Action 1 earns 10 >= 9: the streak of one episode at the goal and one more (the
        # stability window) converges the run.
        while True:
            env.reset()
            episodes += 1
            for _ in range(5):
                env.step(1)
    assert episodes == 2
    with pytest.raises(StopIteration):
        env.step(1)  # the run is over: so is every step of it
    env.begin_stage(evaluate)
    _, info = env.reset()
    assert info["arbiter"]["stage"] == "eval" and info["arbiter"]["item"] == evaluate["items"][0]
    for _ in range(5):
        env.step(0)
    env.submit()
    env.close()
    assert finish(outcome)["state"] == "SUCCESS"
    # A record per training episode, all of the run's item; then the evaluation episode's.
    played = [(record["index"], record["stage"]) for record in read_episodes(results)]
    assert played == [(0, "train"), (0, "train"), (1, "eval")]


def test_a_tuple_observation_comes_back_a_tuple_as_in_process(redis_url, service_id, tmp_path):
    """Blackjack's observation is a Tuple: msgpack carries it as a list, RemoteEnv gives the env's
    tuple back (a tabular agent keys its table with it), equal to the same seeded env's in process."""
    from fake_envs import fake_spec

    spec = fake_spec(env_id="Blackjack-v1", env_kwargs={}, reward_per_step=None, worst_return=-1.0, phase=1,
                     num_episodes=3)  # fmt: skip
    results = str(tmp_path / "r")
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = connect(redis_url, service_id)
        assert isinstance(env.observation_space, gymnasium.spaces.Tuple)
        remote, local = [], []
        local_env = gymnasium.make("Blackjack-v1")
        for _ in range(3):
            observation, _ = env.reset()
            *_, terminated, _, info = env.step(0)  # stick: the episode ends, and names its seed
            assert terminated
            remote.append(observation)
            local.append(local_env.reset(seed=info["arbiter"]["seed"])[0])
        env.submit()
        env.close()
        assert finish(outcome)["state"] == "SUCCESS"
    assert all(type(observation) is tuple for observation in remote)
    assert remote == local and {observation: 0 for observation in remote}  # hashable, as the env's own


def test_a_closed_env_lets_the_next_one_in_at_once(serve, redis_url, service_id):
    """close() releases the evaluation: a second RemoteEnv is served at once, where it would
    otherwise be refused (OTHER_CLIENT) until the first had been silent for its step budget (5 s
    here, ten times the second one's reply timeout)."""
    _, outcome, results = serve(num_episodes=2, length=2)
    first = connect(redis_url, service_id)
    first.reset()
    first.step(1), first.step(1)  # the episode is over
    first.close()
    second = connect(redis_url, service_id, reply_timeout_s=0.5)
    _, info = second.reset()
    assert info["arbiter"]["item"] == 1
    second.step(0), second.step(0)
    second.submit()
    second.close()
    summary = finish(outcome)
    assert summary["state"] == "SUCCESS"
    assert summary["counters"]["releases"] == 1  # the second close(), after the submit, finds the evaluation over
    assert [record["return"] for record in read_episodes(results)] == [4.0, 2.0]


def test_an_episode_left_running_by_a_closed_env_times_out_when_the_next_client_comes(serve, redis_url, service_id):
    """Releasing ends nothing by itself: the successor's handshake times the running episode out,
    as it would a crashed client's."""
    _, outcome, results = serve(num_episodes=2, length=3)
    first = connect(redis_url, service_id)
    first.reset()
    first.step(1)
    first.close()
    second = connect(redis_url, service_id, reply_timeout_s=0.5)
    _, info = second.reset()
    assert info["arbiter"]["item"] == 1
    for _ in range(3):
        second.step(1)
    second.submit()
    second.close()
    summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["counters"]["takeovers"] == 1
    assert [record["ended"] for record in read_episodes(results)] == ["step_timeout", "finished"]


def test_a_step_sent_after_the_evaluation_ended_by_itself_raises_its_ending(serve, redis_url, service_id):
    """The overall budget runs out while the agent thinks; its next step's packet takes the ending
    from the errors list, and no evaluator is left to answer the step: the ending is raised after
    the first wait for a reply, not ServerUnavailable at the reply timeout."""
    from arbiter.protocol.errors import EvaluationError

    _, outcome, _ = serve(num_episodes=2, length=3, budgets={"overall_s": 0.3})
    env = connect(redis_url, service_id, reply_timeout_s=5)
    env.wire.resend_after_s = 0.2  # the first wait: what an answer from a live evaluator would take at most
    env.reset()
    ended = finish(outcome)["state"]  # while the agent thinks
    with pytest.raises(EvaluationError, match="overall") as told:
        env.step(1)
    assert told.value.ended == ended
    env.close()


def test_render_returns_none_as_an_env_without_a_render_mode_does(serve, redis_url, service_id):
    """A loop that calls ``render()`` every step (DIAMBRA's examples, Gymnasium's) plays on."""
    _, outcome, results = serve(num_episodes=1, length=2)
    env = connect(redis_url, service_id)
    env.reset()
    assert env.render_mode is None and env.render() is None
    for _ in range(2):
        env.step(0)
        assert env.render() is None
    env.submit()
    env.close()
    assert finish(outcome)["state"] == "SUCCESS"
    assert [record["return"] for record in read_episodes(results)] == [2.0]


def test_an_env_made_from_a_class_has_no_spec(serve, redis_url, service_id):
    serve(num_episodes=1)
    env = connect(redis_url, service_id)
    assert env.spec is None
    env.close()
