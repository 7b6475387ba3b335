"""Submitting and cancelling through the Python API: refused input changes nothing."""

from __future__ import annotations

import pytest
import redis
from hosting_farm import competition_file, seeded_agent
from rq.job import Job, JobStatus

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import DEBUG_EPISODES, DEBUG_OVERALL_S
from arbiter.server.hosting.farm import CANCELLED_BY_ORGANISER, cancel, submission_spec, submit
from arbiter.server.hosting.queue import SERIALIZER, arbiter_queue, job_timeout_s
from arbiter.server.hosting.quotas import QuotaExceeded
from arbiter.server.hosting.submissions import CANCELLED, QUEUED, Submission, SubmissionStore, UnknownSubmission


def snapshot(conn: redis.Redis) -> dict[bytes, bytes]:
    return {key: conn.dump(key) for key in conn.keys("*")}


def test_a_submission_is_recorded_and_queued(redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(
        redis_conn, competition=competition, participant="alice", agent=seeded_agent(), workdir=str(tmp_path),
        sets=["budgets.step_s=1.5"],
    )  # fmt: skip
    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == QUEUED and found.participant == "alice" and found.competition_name == "farm"
    assert found.competition == competition and found.workdir == str(tmp_path) and found.sets == ["budgets.step_s=1.5"]
    assert found.agent == seeded_agent() and found.submitted_at > 0
    assert arbiter_queue(redis_conn).job_ids == [submission.id]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"competition": "no-such-competition"}, "unknown competition 'no-such-competition'"),
        ({"workdir": "/no/such/folder"}, "--workdir '/no/such/folder' is not a folder"),
        ({"participant": " "}, "--participant is empty"),
        ({"agent": []}, "no agent command"),
        ({"sets": ["budgets.nope=1"]}, "unknown budget keys"),
        # what bounds the submission itself is the competition file's alone
        ({"sets": ["hosting.daily_submissions=100"]}, r"--set hosting.daily_submissions: a competition's \[hosting\]"),
        ({"sets": ["hosting.memory=64g"]}, "never from a submission"),
        ({"sets": [" leaderboard.ranking = borda"]}, r"--set leaderboard.ranking: a competition's \[leaderboard\]"),
        # an image no engine could pull (capitals in its path, a doubled colon): refused before it
        # takes a quota slot, as the agent's fault it would be on a worker
        ({"image": "Team/Agent:v3"}, "--image 'Team/Agent:v3' is not an image name"),
        ({"image": "team/agent::v3"}, "--image 'team/agent::v3' is not an image name"),
        # a debug submission is --debug's: its own quota, never ranked
        ({"sets": ["debug=true"]}, "--set debug: a debug submission is made with --debug"),
        # a training goal no agent can reach within its steps: refused before it takes a quota slot
        (
            {"competition": "two-phase-cartpole", "sets": ["phase2.max_steps=1000"]},
            r"infeasible phase 2: converging needs 11 episodes .* = 5225 env steps",
        ),
        (
            {"competition": "two-phase-cartpole", "sets": ["phase2.goal_reward=501"]},
            "cannot be reached in one episode of CartPole-v1: it needs 501 steps .* episodes end after 500",
        ),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(redis_conn, tiny_tests, tmp_path, given, message) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    before = snapshot(redis_conn)
    arguments = {"competition": competition, "participant": "alice", "agent": seeded_agent(), **given}
    with pytest.raises(ConfigError, match=message):
        submit(redis_conn, **arguments)
    assert snapshot(redis_conn) == before


def test_another_competition_file_of_a_known_name_is_refused_and_changes_nothing(
    redis_conn, tiny_tests, tmp_path
) -> None:
    """round-1/cup.toml and round-2/cup.toml would share results/cup, its quotas and its board."""
    first, second = tmp_path / "round-1", tmp_path / "round-2"
    first.mkdir()
    second.mkdir()
    cup = competition_file(first, tiny_tests, name="cup")
    submit(redis_conn, competition=cup, participant="alice", agent=seeded_agent())
    other = competition_file(second, tiny_tests, name="cup", overall_s=120)
    before = snapshot(redis_conn)
    with pytest.raises(ConfigError, match=rf"competition 'cup' on this farm is {cup}; {other} is another file"):
        submit(redis_conn, competition=other, participant="alice", agent=seeded_agent())
    assert snapshot(redis_conn) == before
    # The same file edited in place, or moved elsewhere whole, is still the competition.
    competition_file(first, tiny_tests, name="cup", overall_s=90)
    submit(redis_conn, competition=cup, participant="bob", agent=seeded_agent())
    (first / "cup.toml").rename(second / "cup.toml")
    assert submit(redis_conn, competition=other, participant="carol", agent=seeded_agent()).competition_name == "cup"
    with pytest.raises(ConfigError, match="another file of the same name"):  # the moved file is cup's now
        submit(redis_conn, competition=competition_file(first, tiny_tests, name="cup"), participant="dan",
               agent=seeded_agent())  # fmt: skip


def test_a_used_up_quota_is_refused_and_changes_nothing(redis_conn, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests, hosting="daily_submissions = 1")
    submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    before = snapshot(redis_conn)
    with pytest.raises(QuotaExceeded, match="resets at"):
        submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    assert snapshot(redis_conn) == before
    submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent())


def test_cancelling_a_queued_submission_takes_its_job_off_the_queue(redis_conn, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    cancelled = cancel(redis_conn, submission.id)
    assert cancelled.state == CANCELLED and cancelled.cause == CANCELLED_BY_ORGANISER
    assert arbiter_queue(redis_conn).job_ids == []
    job = Job.fetch(submission.id, connection=redis_conn, serializer=SERIALIZER)
    assert job.get_status() == JobStatus.CANCELED
    before = snapshot(redis_conn)
    with pytest.raises(ConfigError, match="already ended \\(cancelled\\)"):
        cancel(redis_conn, submission.id)
    with pytest.raises(UnknownSubmission, match="no submission 'sub-nope'"):
        cancel(redis_conn, "sub-nope")
    assert snapshot(redis_conn) == before


def test_a_debug_submission_is_evaluated_as_a_debug_run(redis_conn, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests, overall_s=4000)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), debug=True)
    spec = submission_spec(SubmissionStore(redis_conn).get(submission.id))
    assert spec.debug is True and spec.max_episodes == DEBUG_EPISODES
    assert spec.budgets.overall_s == DEBUG_OVERALL_S
    assert submission.timeout_s == job_timeout_s(spec) < 4000, "the job's timeout is the debug budget's"
    official = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent())
    assert submission_spec(official).debug is False and official.timeout_s == job_timeout_s(submission_spec(official))


def test_a_phase_is_the_competition_s_phase_key(redis_conn) -> None:
    submission = submit(
        redis_conn, competition="two-phase-cartpole", participant="alice", agent=seeded_agent(), phase=2
    )
    assert submission_spec(submission).options.phase == 2
    with pytest.raises(ConfigError, match="phase"):
        submit(redis_conn, competition="flatland-debug", participant="alice", agent=seeded_agent(), phase=2)


@pytest.mark.parametrize(
    "image", ["team/agent:v3", "localhost:5000/team/agent", "rootfs:/", "alpine@sha256:" + "a" * 64]
)
def test_an_image_name_podman_reads_is_taken(redis_conn, tiny_tests, tmp_path, image) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    assert (
        submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), image=image).image
        == image
    )


def test_the_competition_s_image_is_checked_when_its_file_is_loaded(tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests, hosting='image = "Registry.example.org/Agent:1"')
    with pytest.raises(ConfigError, match=r"\[hosting\] image must be an image name"):
        submission_spec(Submission(id="sub-1", competition=competition, participant="alice", agent=["a"]))
