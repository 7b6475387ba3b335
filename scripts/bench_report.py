"""The Flatland benchmark's results: trajectory checks, per-path summaries over rounds, ratios, and
the printed table."""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench_flatland import LOCAL_PATHS, PATHS
from harness import Target, benchmark_time_line, machine_line, median_of, per_round_ratios, spread

PEERS = ("direct", "lean", "flatland")  # what arbiter's wall time is compared with
TARGETS = (
    Target("arbiter_over_direct", "arbiter", "the direct loop", "in wall time", 1.15, at_least=False),
    # the evaluator's own cost: the lean loop does the same env work as arbiter's agent
    Target("arbiter_over_lean", "arbiter", "the lean loop", "in wall time", 1.10, at_least=False, every_round=True),
    Target("arbiter_over_flatland", "arbiter", "flatland-rl's own evaluator", "in wall time", 0.6, at_least=False),
)


def compare(label: str, reference: list[dict[str, Any]], seen: list[dict[str, Any]]) -> list[str]:
    problems = []
    if len(seen) != len(reference):
        problems.append(f"{label}: {len(seen)} episodes, the direct loop played {len(reference)}")
    for ref, got in zip(reference, seen, strict=False):
        for key in ("env", "steps", "arrived"):
            if ref[key] != got[key]:
                problems.append(f"{label}: {ref['env']}: {key} {got[key]!r}, direct {ref[key]!r}")
    return problems


def contention_summary(pairs: list[list[dict[str, Any]]], lean_runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each round's pair against that round's lean loop alone: mean pair wall / alone wall."""
    if not pairs:
        return None
    factors = [
        statistics.fmean(r["wall_s"] for r in pair) / alone["wall_s"]
        for pair, alone in zip(pairs, lean_runs, strict=True)
    ]
    return {
        "pair_walls_s": [[r["wall_s"] for r in pair] for pair in pairs],
        "factor_per_round": factors,
        "factor_median": statistics.median(factors),
    }


def floor_summary(mirrored: list[dict[str, Any]], lean_runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each round's mirrored lean loop (bench_flatland_floor.py) against that round's lean loop."""
    if not mirrored:
        return None
    factors = [run["wall_s"] / alone["wall_s"] for run, alone in zip(mirrored, lean_runs, strict=True)]
    return {"walls_s": [run["wall_s"] for run in mirrored], "factor_per_round": factors,
            "factor_median": statistics.median(factors), "factor_min": min(factors)}  # fmt: skip


def summarise_path(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path over its rounds: medians across rounds (and the spread of the wall time)."""
    walls = [run["wall_s"] for run in runs]
    creates = [c for run in runs for c in run["create_s"]]
    waits = [w for run in runs for w in run["create_wait_s"]]
    steps = sum(e["steps"] for e in runs[0]["episodes"])

    def step_total(run: dict[str, Any]) -> float:
        return run["step_s"]["total"]

    def other(run: dict[str, Any]) -> float:
        accounted = step_total(run) + run["create_total_s"] + run["final_create_s"] + run["submit_s"]
        return run["wall_s"] - accounted

    return {
        "wall_s": spread(walls),
        "steps": steps,
        "steps_per_s": steps / statistics.median(walls),
        "client_step_mean_s": median_of(runs, lambda r: r["step_s"]["mean"]),
        "client_step_p99_s": median_of(runs, lambda r: r["step_s"]["p99"]),
        "local_step_mean_s": median_of(runs, lambda r: r["local_step_s"]["mean"]),
        "step_overhead_mean_s": median_of(runs, lambda r: r["step_s"]["mean"] - r["local_step_s"]["mean"]),
        "env_create_median_s": statistics.median(creates) if creates else None,
        "env_create_wait_median_s": statistics.median(waits) if waits else None,
        "server_step_mean_s": median_of(runs, lambda r: r.get("server_step_mean_s")),
        "server_think_mean_s": median_of(runs, lambda r: r.get("server_think_mean_s")),
        # Where the agent's wall time goes (seconds, median over rounds).
        "breakdown_s": {
            "local_env_step": median_of(runs, lambda r: r["local_step_s"]["total"]),
            "step_wire": median_of(runs, lambda r: step_total(r) - r["local_step_s"]["total"]),
            "create_wait": median_of(runs, lambda r: math.fsum(r["create_wait_s"])),
            "create_local": median_of(runs, lambda r: r["create_total_s"] - math.fsum(r["create_wait_s"])),
            "final_create": median_of(runs, lambda r: r["final_create_s"]),
            "submit": median_of(runs, lambda r: r["submit_s"]),
            "agent_other": median_of(runs, other),
        },
        "runs": [
            {
                "wall_s": run["wall_s"],
                "step_s": run["step_s"],
                "local_step_s": run["local_step_s"],
                "create_s": run["create_s"],
                "create_wait_s": run["create_wait_s"],
                "final_create_s": run["final_create_s"],
                "submit_s": run["submit_s"],
                "handshake_s": run.get("handshake_s"),
                "server_step_mean_s": run.get("server_step_mean_s"),
                "server_think_mean_s": run.get("server_think_mean_s"),
            }
            for run in runs
        ],
    }


def ms(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value * 1e3:.{digits}f}"


def _memory_line(label: str, memory: dict[str, Any]) -> str:
    growth, per_episode = memory["growth"], memory.get("kib_per_episode")
    first, last = memory["first"], memory["last"]
    verdict = "flat" if memory["flat"] else "GROWING"
    after = memory.get("after_submit")
    return (
        f"{label}: {first[1] / 1024:.1f} MiB after episode {first[0]} → {last[1] / 1024:.1f} MiB after episode "
        f"{last[0]} ({'n/a' if growth is None else f'{growth * 100:+.1f} %'}, "
        f"{'n/a' if per_episode is None else f'{per_episode:+.1f} KiB per episode'}, {verdict})"
        + (f"; {after[1] / 1024:.1f} MiB after submit" if after else "")
        + f"; samples (episode: MiB) {', '.join(f'{s[0]}: {s[1] / 1024:.0f}' for s in memory['samples_kib'])}"
    )


def print_table(report: dict[str, Any]) -> None:
    cfg = report["config"]
    mach = report["machine"]
    paths = report["paths"]
    ref = report["reference"]
    print()
    print(
        f"arbiter benchmark — the reference levels (seed {cfg['testset_seed']}), {len(ref)} envs, "
        f"{sum(e['steps'] for e in ref)} steps; {cfg['rounds']} round(s); {machine_line(mach)}; {cfg['transport']}"
    )
    print("reference trajectories (the direct loop; both remote paths must match, client and server side):")
    for e in ref:
        print(f"  {e['env']}: {e['agents']} agents, {e['steps']} steps, {e['arrived']} arrived")
    print()
    header = (
        f"{'path':<9} {'wall s: median [min–max]':<26} {'steps/s':>7}  {'client step ms mean/p99':>23}  "
        f"{'in env.step':>11}  {'wire/step':>9}  {'server step':>11}  {'env_create ms (wait)':>20}"
    )
    print(header)
    print("-" * len(header))
    for name in PATHS:
        p = paths[name]
        wall = p["wall_s"]
        wait = "" if name in LOCAL_PATHS else f" ({ms(p['env_create_wait_median_s'], 1)})"
        print(
            f"{name:<9} {wall['median']:>7.3f} [{wall['min']:.3f}–{wall['max']:.3f}]{'':<3} {p['steps_per_s']:>7.0f}  "
            f"{ms(p['client_step_mean_s'], 3) + ' / ' + ms(p['client_step_p99_s'], 3):>23}  "
            f"{ms(p['local_step_mean_s'], 3):>11}  {ms(p['step_overhead_mean_s'], 3):>9}  "
            f"{ms(p['server_step_mean_s'], 3):>11}  {ms(p['env_create_median_s'], 1) + wait:>20}"
        )
    print(
        "(times per step in ms; 'in env.step' is the local env.step inside the client's env_step, 'wire/step' the rest)"
    )
    print()
    print("where the agent's wall time goes (s, median over rounds):")
    keys = ["local_env_step", "step_wire", "create_wait", "create_local", "final_create", "submit", "agent_other"]
    print(f"{'path':<9} " + " ".join(f"{k:>14}" for k in keys) + f" {'wall':>8}")
    for name in PATHS:
        b = paths[name]["breakdown_s"]
        print(f"{name:<9} " + " ".join(f"{b[k]:>14.3f}" for k in keys) + f" {paths[name]['wall_s']['median']:>8.3f}")
    print(
        "(create_wait: waiting for the evaluator's env_create reply; create_local: loading/building + reset in the "
        "agent; final_create: the closing env_create, which waits for the evaluator to finish the last episode)"
    )
    ratios = report["ratios"]
    print()
    print(
        f"ratios of median wall times: arbiter/direct = {ratios['arbiter_over_direct']:.3f}, "
        f"arbiter/lean = {ratios['arbiter_over_lean']:.3f}, arbiter/flatland = {ratios['arbiter_over_flatland']:.3f}"
    )
    paired = ratios["median_of_round_ratios"]
    print(
        f"median of the per-round ratios: arbiter/direct = {paired['arbiter_over_direct']:.3f}, "
        f"arbiter/lean = {paired['arbiter_over_lean']:.3f}, arbiter/flatland = {paired['arbiter_over_flatland']:.3f}"
    )
    for r in ratios["per_round"]:
        print(
            f"  round {r['round']}: direct {r['direct_s']:.3f} s, lean {r['lean_s']:.3f} s, arbiter "
            f"{r['arbiter_s']:.3f} s, flatland {r['flatland_s']:.3f} s → arbiter/direct "
            f"{r['arbiter_over_direct']:.3f}, arbiter/lean {r['arbiter_over_lean']:.3f}, "
            f"arbiter/flatland {r['arbiter_over_flatland']:.3f}"
        )
    print(
        "(direct: flatland's load_new, with its default rewards, step recorder and eager distance map; lean: the "
        "env arbiter's client builds, so arbiter/lean is the evaluator's own cost)"
    )
    for target in TARGETS:
        print(target.line(ratios["paired"][target.ratio]))
    contention = report.get("contention")
    if contention:
        print(
            f"two lean loops at once (independent processes, no evaluator): each took "
            f"{contention['factor_median']:.3f}× its time alone (median over rounds; "
            + ", ".join(f"{f:.2f}" for f in contention["factor_per_round"])
            + "): what two busy processes cost each other on this machine now"
        )
    floor = report.get("floor")
    if floor:
        lean_target = next(t for t in TARGETS if t.ratio == "arbiter_over_lean")
        below = floor["factor_min"] > lean_target.bound
        print(
            f"floor: the lean loop with every step sent through Redis to a process stepping its own copy (arbiter's "
            f"packets, no evaluator) took {floor['factor_median']:.3f}× the lean loop (median over rounds; "
            + ", ".join(f"{f:.2f}" for f in floor["factor_per_round"])
            + f"): {'above' if below else 'not above'} the target's {lean_target.bound:g} in every round"
        )
    a = paths["arbiter"]
    if a.get("server_think_mean_s") is not None:
        print(
            f"arbiter server (summary.json): step {ms(a['server_step_mean_s'], 3)} ms mean; the agent's time between "
            f"steps as the server sees it (step_think_s) {ms(a['server_think_mean_s'], 3)} ms mean"
        )
    trajectories = report["trajectories"]
    if trajectories["match"]:
        print(f"trajectories: identical in all {trajectories['runs_checked']} runs (client and server side)")
    else:
        print("trajectories: MISMATCH")
        for line in trajectories["mismatches"]:
            print(f"  MISMATCH {line}")

    proto = report.get("protocol")
    if proto:
        print()
        print(
            f"protocol only: {proto['n']} empty ENV_STEP requests in {proto['elapsed_s']:.3f} s = "
            f"{proto['steps_per_s']:.0f} steps/s; client {proto['client_call_mean_s'] * 1e6:.1f} µs per "
            f"send+collect (all sent after {proto['send_s']:.3f} s); server read them in "
            f"{proto['server_span_s']:.3f} s "
            f"({proto['server_steps_read'] / max(proto['server_span_s'], 1e-9):.0f}/s), decode "
            f"{proto['server_decode_mean_s'] * 1e6:.1f} µs per request"
        )
    creates = report.get("env_create")
    if creates:
        print(
            "env_create on the client, median per episode: "
            f"arbiter {ms(creates['arbiter_s'], 1)} ms, flatland {ms(creates['flatland_s'], 1)} ms "
            f"(direct load+reset {ms(creates['direct_s'], 1)} ms, lean {ms(creates['lean_s'], 1)} ms); "
            f"arbiter/flatland {creates['arbiter_over_flatland']:.2f}"
        )
    memory = report.get("memory")
    if memory:
        print(_memory_line(f"server memory (arbiter serve VmRSS, {memory['episodes']} tiny episodes)", memory))
        if memory.get("direct_loop"):
            print(_memory_line("  the same episodes in a plain flatland loop (one process)", memory["direct_loop"]))
    scale = report.get("scale")
    if scale:
        print(
            f"scale: {scale['count']} concurrent evaluations on one Redis: "
            f"{'all match the single run' if scale['consistent'] else 'MISMATCH'}; aggregate "
            f"{scale['aggregate_steps_per_s']:.0f} steps/s over {scale['span_s']:.2f} s vs "
            f"{scale['single_steps_per_s']:.0f} steps/s alone (×{scale['speedup']:.2f}); wall per evaluation "
            f"{' '.join(f'{w:.2f}' for w in scale['walls_s'])} s"
        )
        for line in scale["mismatches"]:
            print(f"  MISMATCH {line}")
    print()
    print(f"{benchmark_time_line(report)}; raw results: {report.get('json_path') or '(no --json)'}")


# ----------------------------------------------------------------------------------------
# The report: every figure of a finished benchmark, as written to --json
# ----------------------------------------------------------------------------------------


def check_trajectories(
    runs: dict[str, list[dict[str, Any]]], pairs: list[list[dict[str, Any]]], mirrored: list[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Every run against the first direct loop's episodes, on the client and the server side."""
    reference = runs["direct"][0]["episodes"]
    mismatches: list[str] = []
    checked = 0
    for name in PATHS:
        for i, run in enumerate(runs[name], start=1):
            mismatches += compare(f"{name} round {i} (client)", reference, run["episodes"])
            checked += 1
            if "server_episodes" in run:
                mismatches += compare(f"{name} round {i} (server)", reference, run["server_episodes"])
    for i, pair in enumerate(pairs, start=1):
        for run in pair:
            mismatches += compare(f"lean ×2 round {i}", reference, run["episodes"])
    for i, run in enumerate(mirrored, start=1):
        mismatches += compare(f"floor round {i}", reference, run["episodes"])
    for i, run in enumerate(runs["arbiter"], start=1):
        if run.get("state") != "SUCCESS":
            mismatches.append(f"arbiter round {i}: evaluation state {run.get('state')}")
    return {"match": not mismatches, "runs_checked": checked, "mismatches": mismatches}


def ratios_report(runs: dict[str, list[dict[str, Any]]], summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """arbiter's wall time over each peer's: the ratio of the medians, and per round (paired)."""
    medians = {name: summaries[name]["wall_s"]["median"] for name in PATHS}
    paired = {f"arbiter_over_{peer}": per_round_ratios(runs["arbiter"], runs[peer], "wall_s") for peer in PEERS}
    per_round = []
    for i in range(len(runs["arbiter"])):
        row: dict[str, Any] = {"round": i + 1, **{f"{name}_s": runs[name][i]["wall_s"] for name in PATHS}}
        row.update({name: ratio["per_round"][i] for name, ratio in paired.items()})
        per_round.append(row)
    return {
        **{f"arbiter_over_{peer}": medians["arbiter"] / medians[peer] for peer in PEERS},
        "median_of_round_ratios": {name: ratio["median"] for name, ratio in paired.items()},
        "paired": paired,
        "per_round": per_round,
    }


def paths_report(
    config: dict[str, Any],
    machine: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    pairs: list[list[dict[str, Any]]],
    mirrored: list[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The rounds' part of the report: config, the machine (``machine_info`` as the benchmark began), reference,
    per-path summaries, ratios, checks."""
    summaries = {name: summarise_path(runs[name]) for name in PATHS}
    trajectories = check_trajectories(runs, pairs, mirrored)
    reference = runs["direct"][0]["episodes"]
    ratios = ratios_report(runs, summaries)
    return {
        "config": config,
        "machine": machine,
        "reference": reference,
        "paths": summaries,
        "raw_runs": runs,
        "ratios": ratios,
        "targets": [target.report(ratios["paired"][target.ratio]) for target in TARGETS],
        "trajectories": trajectories,
        "contention": contention_summary(pairs, runs["lean"]),
        "floor": floor_summary(mirrored, runs["lean"]),
        "trajectories_match": trajectories["match"],
        "env_create": {
            "direct_s": summaries["direct"]["env_create_median_s"],
            "lean_s": summaries["lean"]["env_create_median_s"],
            "arbiter_s": summaries["arbiter"]["env_create_median_s"],
            "flatland_s": summaries["flatland"]["env_create_median_s"],
            "arbiter_over_flatland": summaries["arbiter"]["env_create_median_s"]
            / summaries["flatland"]["env_create_median_s"],
        },
    }


def scale_report(scale: dict[str, Any], reference: list[dict[str, Any]], single: dict[str, Any], single_rate: float):
    """Concurrent evaluations: each must match the direct loop and score exactly as the single run."""
    problems = []
    for i, run in enumerate(scale["runs"]):
        problems += compare(f"scale evaluation {i} (client)", reference, run["episodes"])
        problems += compare(f"scale evaluation {i} (server)", reference, run["server_episodes"])
        if run["state"] != "SUCCESS":
            problems.append(f"scale evaluation {i}: state {run['state']}")
        if run["score"] != single["score"]:
            problems.append(f"scale evaluation {i}: score {run['score']}, single run {single['score']}")
    span = max(r["end_epoch"] for r in scale["runs"]) - min(r["start_epoch"] for r in scale["runs"])
    total_steps = sum(sum(e["steps"] for e in r["episodes"]) for r in scale["runs"])
    return {
        "count": scale["count"],
        "consistent": not problems,
        "mismatches": problems,
        "span_s": span,
        "total_steps": total_steps,
        "aggregate_steps_per_s": total_steps / span,
        "single_steps_per_s": single_rate,
        "speedup": (total_steps / span) / single_rate,
        "walls_s": [r["wall_s"] for r in scale["runs"]],
        "client_step_mean_s": [r["step_s"]["mean"] for r in scale["runs"]],
        "server_step_mean_s": [r["server_step_mean_s"] for r in scale["runs"]],
        "scores": [r["score"] for r in scale["runs"]],
        "single_score": single["score"],
    }
