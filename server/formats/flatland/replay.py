"""``arbiter replay``: play a recorded episode again, check it, and render it as an animated GIF
(the format's ``replay`` hook, ``replay_episode``).

The env is opened exactly as the evaluator opened it (same loader, seed and reward model), the
recorded actions are applied step by step, and every frame is drawn with flatland-rl's own
renderer (``RenderTool`` with a PIL backend, which needs no display). The replayed trajectory is
then checked against the episode's record in ``episodes.jsonl``: steps, arrivals and reward.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.output_files import check_output_file, make_output_folder
from arbiter.server.core.words import plural
from arbiter.server.formats.flatland.episodes import EpisodeSpec, FlatlandEpisode
from arbiter.server.service.records_file import read_records
from arbiter.server.service.results import EPISODES_FILE, REPLAYS_DIR, replay_file

RENDERERS = ("PILSVG", "PIL")  # flatland's headless backends: SVG artwork, or plain shapes (faster)
MAX_GIF_FRAMES = 500  # longer episodes are drawn every k-th step: a GIF's frames are all in memory
PROGRESS_BAR_WIDTH = 30
DEFAULT_FPS = 8.0


@dataclass
class ReplayOutcome:
    index: int
    env: str
    frames: int
    steps: int
    arrived: int
    num_agents: int
    reward: float
    mismatches: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return not self.mismatches


def _summary_format(results_dir: str) -> str:
    """The evaluation's format, as its summary.json names it (Flatland's before formats existed)."""
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as handle:
            return str(json.load(handle).get("format") or "flatland")
    except (OSError, ValueError, AttributeError):
        return "flatland"


def load_replay(results_dir: str, index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded actions of episode ``index`` and its record; clear errors for what is missing."""
    if not os.path.isdir(results_dir):
        raise ConfigError(f"results folder {results_dir!r} does not exist")
    format_name = _summary_format(results_dir)
    if format_name != "flatland":
        raise ConfigError(
            f"{results_dir} is a {format_name} evaluation: replays exist for the flatland format only "
            "(its env is rebuilt from the test folder and the recorded actions)"
        )
    path = replay_file(results_dir, index)
    if not os.path.isfile(path):
        replays = os.path.join(results_dir, REPLAYS_DIR)
        recorded = sorted(
            int(name[len("episode-") : -len(".json")])
            for name in (os.listdir(replays) if os.path.isdir(replays) else [])
            if name.startswith("episode-") and name.endswith(".json") and name[8:-5].isdigit()
        )
        have = f"recorded episodes: {', '.join(map(str, recorded))}" if recorded else "no episode was recorded"
        raise ConfigError(
            f"episode {index} was not recorded in {results_dir} ({have}); "
            "record episodes with `arbiter serve --record N` or `arbiter run --record N`"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            replay = json.load(handle)
        actions = [{int(handle): int(action) for handle, action in step.items()} for step in replay["actions"]]
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ConfigError(f"{path} is not a readable replay: {exc}") from None
    replay["actions"] = actions
    return replay, _episode_record(results_dir, index)


def _episode_record(results_dir: str, index: int) -> dict[str, Any]:
    path = os.path.join(results_dir, EPISODES_FILE)
    try:
        records = read_records(path)  # whole items only, as resume and scoring read them
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    for record in records:
        if record.get("index") == index:
            return record
    raise ConfigError(f"{path} has no record of episode {index}, so the replay cannot be checked")


def tests_folder(results_dir: str, tests: str | None) -> str:
    """``--tests``, else the folder the evaluation named in its summary.json."""
    if tests:
        return tests
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as handle:
            named = json.load(handle).get("tests")
    except (OSError, ValueError):
        named = None
    if not named:
        raise ConfigError(f"{results_dir} has no summary.json naming the test folder: pass --tests DIR")
    return named


def replay_to_gif(
    results_dir: str,
    index: int,
    *,
    out: str,
    tests: str | None = None,
    renderer: str = RENDERERS[0],
    fps: float = DEFAULT_FPS,
    every: int | None = None,
    progress: TextIO | None = None,
) -> ReplayOutcome:
    """Replay episode ``index`` of ``results_dir`` into the GIF ``out``; see ReplayOutcome.matches."""
    if renderer not in RENDERERS:
        raise ConfigError(f"unknown renderer {renderer!r}; use one of {', '.join(RENDERERS)}")
    check_output_file(out)  # before the replay: a path that cannot take the GIF is said at once
    replay, record = load_replay(results_dir, index)
    tests_dir = tests_folder(results_dir, tests)
    env_path = os.path.join(tests_dir, replay["env"])
    if not os.path.isfile(env_path):
        raise ConfigError(f"{env_path} not found: is {tests_dir!r} the evaluation's test folder? (--tests DIR)")
    test, level_file = replay["env"].split("/", 1)
    spec = EpisodeSpec(index=index, env=replay["env"], test=test, level=os.path.splitext(level_file)[0])
    episode = FlatlandEpisode(tests_dir, spec, replay["seed"], replay["reward_model"])
    actions = replay["actions"]
    every = every or max(1, math.ceil(len(actions) / MAX_GIF_FRAMES))
    outcome = ReplayOutcome(index, replay["env"], 0, 0, 0, episode.num_agents, 0.0)
    frames = _frames(episode, actions, renderer, every, outcome, progress)
    first = next(frames)
    make_output_folder(out)  # once the episode replayed: a refused replay leaves no folder behind
    tmp = f"{out}.tmp.{os.getpid()}"
    try:
        # Frames are drawn as the GIF writer asks for them, so only the encoded ones are kept.
        first.save(tmp, format="GIF", save_all=True, append_images=frames, duration=round(1000 / fps), loop=0)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    outcome.steps, outcome.arrived, outcome.reward = episode.steps, episode.arrived(), episode.reward
    outcome.mismatches += _compare(outcome, record)
    return outcome


def replay_episode(
    results_dir: str, index: int, options: dict[str, Any], progress: TextIO | None
) -> tuple[list[str], list[str]]:
    """The ``replay`` hook: episode ``index`` replayed into the GIF ``options["out"]``, with
    ``arbiter replay``'s other options; the lines to print, and the differences from its record."""

    out = options.get("out")
    if not out:
        raise ConfigError("replaying a flatland episode needs --out FILE.gif")
    outcome = replay_to_gif(
        results_dir,
        index,
        out=out,
        tests=options.get("tests"),
        renderer=options.get("renderer") or RENDERERS[0],
        fps=options.get("fps") or DEFAULT_FPS,
        every=options.get("every"),
        progress=progress,
    )
    lines = [f"rendered {plural(outcome.frames, 'frame')} of episode {outcome.index} ({outcome.env}) into {out}"]
    if outcome.matches:
        lines.append(
            f"the replay matches the recorded episode: {plural(outcome.steps, 'step')}, "
            f"{outcome.arrived}/{outcome.num_agents} arrived, reward {outcome.reward:g}"
        )
    return lines, outcome.mismatches


def _frames(
    episode: FlatlandEpisode,
    actions: list[dict[int, int]],
    renderer: str,
    every: int,
    outcome: ReplayOutcome,
    progress: TextIO | None,
) -> Iterator[Any]:
    """The start, every ``every``-th step and the last step, drawn; steps every action."""
    from flatland.utils.rendertools import RenderTool
    from PIL import Image

    tool = RenderTool(episode.env, gl=renderer, show_debug=False)

    def draw() -> Any:
        tool.render_env(show=False, show_observations=False, show_predictions=False)
        outcome.frames += 1
        return Image.fromarray(tool.get_image()).convert("RGB")

    total = len(actions)
    bar = _ProgressBar(progress, total)
    yield draw()
    for step, step_actions in enumerate(actions, start=1):
        done = episode.step(step_actions)
        if done and step < total:
            outcome.mismatches.append(f"the env finished after {step} steps; the recording has {total}")
        if step % every == 0 or step == total or done:
            yield draw()
            bar.update(step)
        if done:
            break
    bar.close()


class _ProgressBar:
    """``rendering [#####-----] step 40/100`` on one line of a terminal, redrawn in place; a
    line per tenth when the stream is a file or pipe, so a log is not flooded."""

    def __init__(self, stream: TextIO | None, total: int):
        self.stream = stream
        self.total = max(total, 1)
        self.tty = bool(stream is not None and stream.isatty())
        self.shown = -1  # filled cells (terminal) or tenths (file) last shown
        self.update(0)

    def update(self, done: int) -> None:
        if self.stream is None:
            return
        filled = PROGRESS_BAR_WIDTH * done // self.total
        mark = filled if self.tty else 10 * done // self.total
        if mark == self.shown:
            return
        self.shown = mark
        bar = "#" * filled + "-" * (PROGRESS_BAR_WIDTH - filled)
        text = f"rendering [{bar}] step {done}/{self.total}"
        self.stream.write("\r" + text if self.tty else text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _compare(outcome: ReplayOutcome, record: dict[str, Any]) -> list[str]:
    found = []
    if outcome.steps != record.get("steps"):
        found.append(f"steps: replayed {outcome.steps}, recorded {record.get('steps')}")
    if outcome.arrived != record.get("arrived"):
        found.append(f"arrived: replayed {outcome.arrived}, recorded {record.get('arrived')}")
    recorded_reward = record.get("reward")
    if not isinstance(recorded_reward, (int, float)) or not math.isclose(outcome.reward, recorded_reward, abs_tol=1e-6):
        found.append(f"reward: replayed {outcome.reward:g}, recorded {recorded_reward}")
    return found
