"""Markdown tables for a suite's records: throughput, ratios, the null overhead, sampler scaling and replay."""

from __future__ import annotations

from typing import Any


def _num(x: float | None, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def layout(r: dict[str, Any]) -> str:
    if r["mode"] == "naive":
        return f"{r['workers']} envs (1 process each)"
    if r["mode"] == "naive_vector":
        return f"{r['workers']:,} envs (one VectorEnv)"
    return f"{r['workers']} x {r['envs_per_worker']}"


def throughput_table(records: list[dict[str, Any]]) -> list[str]:
    lines = ["| env | mode | workers x envs | agent steps/s | frames/s | windows (min-max) | limited by | stale "
             "| CPU used | load | device |", "|---|---|---|---:|---:|---|---|---:|---:|---:|---|"]
    for r in records:
        if r.get("scaling") or r["mode"] == "replay":
            continue
        if r.get("error"):
            lines.append(f"| {r['env']} | {r['mode']} | {layout(r)} | failed: {r['error']} | | | | | | | |")
            continue
        spread = f"{_num(r['sps_min'])}-{_num(r['sps_max'])} ({r['repeats']} x {r['window_s']:g} s)"
        cpu = (r.get("stages") or {}).get("cpu_run")
        load = (r.get("machine") or {}).get("load_avg") or [None]
        used = "-" if cpu is None else f"{cpu:.0f}%"
        mode = f"{r['mode']} ({r['label']})" if r.get("label") else r["mode"]
        lines.append(f"| {r['env']} | {mode} | {layout(r)} | {_num(r['sps'])} | {_num(r['fps'])} | {spread} "
                     f"| {r.get('limited_by') or '-'} | {_share(r.get('stale_share'))} | {used} "
                     f"| {_num(load[0], '.1f')} "
                     f"| {r.get('device') or '-'} |")
    return lines


def ratio_table(rows: list[dict[str, Any]]) -> list[str]:
    sf2 = any(row.get("asyncrl_over_sf2") for row in rows)  # a column only when Sample Factory ran
    lines = ["| env | sampler / env_only | train / sampler | asyncrl train / naive |"
             + (" asyncrl train / Sample Factory 2 train |" if sf2 else ""), "|---|---:|---:|---:|" + ("---:|" * sf2)]
    for row in rows:
        lines.append(f"| {row['env']} | {_num(row['sampler_over_env_only'], '.2f')} | "
                     f"{_num(row['train_over_sampler'], '.2f')} | {_num(row['asyncrl_over_naive'], '.2f')} |"
                     + (f" {_num(row.get('asyncrl_over_sf2'), '.2f')} |" if sf2 else ""))
    return lines


def scaling_table(records: list[dict[str, Any]], env: str) -> list[str]:
    points = sorted((r for r in records if r["env"] == env and r["mode"] == "sampler" and r.get("sps")),
                    key=lambda r: r["workers"])
    if len(points) < 2:
        return []
    one = points[0]["sps"]
    lines = [f"Sampler scaling ({env}, {points[0]['envs_per_worker']} envs per worker):", "",
             "| workers | agent steps/s | speed-up vs 1 worker | per worker |", "|---:|---:|---:|---:|"]
    for r in points:
        lines.append(f"| {r['workers']} | {_num(r['sps'])} | {r['sps'] / one:.2f} | {_num(r['sps'] / r['workers'])} |")
    return lines


def _millions(x: float | None) -> str:
    """Transitions/s: `1.23 M`, or `4.9 k` below 100,000."""
    if x is None:
        return "-"
    return f"{x / 1e6:.2f} M" if x >= 1e5 else f"{x / 1e3:.1f} k"


def replay_table(records: list[dict[str, Any]]) -> list[str]:
    """One row per observation kind and sampling: insert and sample transitions/s, PER update time."""
    replay = [r for r in records if r["mode"] == "replay"]
    if not replay:
        return []
    lines = []
    for r in replay:
        if r.get("error"):
            lines += [f"Replay: failed: {r['error']}"]
            continue
        lines += [f"Replay buffers (capacity {r['capacity']:,}; inserts of {r['chunk'][0]} x {r['chunk'][1]} "
                  f"transitions, samples and PER updates of {r['batch']}; medians of {r['repeats']} x "
                  f"{r['window_s']:g} s):", "",
                  "| observation | sampling | held | buffer GiB (touched) | insert transitions/s (first fill) | "
                  f"sample transitions/s (us per {r['batch']}) | PER update of {r['batch']} |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for row in r["replay"]:
            if row.get("skipped"):
                lines.append(f"| {row['observation']} | - | skipped: {row['skipped']} | | | | |")
                continue
            update = row.get("per_update_us")
            lines.append(f"| {row['observation']} {'x'.join(map(str, row['obs_shape']))} {row['obs_dtype']} | "
                         f"{row['sampling']} | {row['held']:,} | {row['buffer_gib']:.2f} ({row['touched_gib']:.2f}) "
                         f"| {_millions(row['insert_per_s'])} ({_millions(row['first_fill_per_s'])}) | "
                         f"{_millions(row['sample_per_s'])} ({row['sample_us']:,.0f}) | "
                         f"{'-' if update is None else f'{update:,.0f} us'} |")
    return [*lines, ""]


NOTES = ("CPU used: share of all cores the benchmark's own processes used while measuring; load: the machine's "
         "1-minute load average when the figure was taken (runnable processes of all users); device: where that "
         "row's models ran (env_only and replay have none: cpu). Trainers are compared only on the same device.")


def markdown(records: list[dict[str, Any]], ratios: list[dict[str, Any]], notes: list[str] | None = None) -> str:
    machine = next((r["machine"] for r in records if r.get("machine")), {})
    load = machine.get("load_avg_before_suite") or []
    cpus = machine.get("cpu_count", 0)
    busy = bool(load) and cpus and load[0] > 0.5 * cpus
    lines = [f"Machine: {cpus} cores ({machine.get('cpu_model', '?')}), {machine.get('memory_gib', '?')} GiB, "
             f"torch {machine.get('torch', '?')}, GPU {machine.get('device', '?')}; load average before the "
             f"run {', '.join(str(x) for x in load) or '?'}" + (" -- MEASURED UNDER LOAD" if busy else ""),
             "", *throughput_table(records), "", NOTES, *(f"Not measured: {n}" for n in notes or []), "",
             *ratio_table(ratios), ""]
    for null in (r for r in records if r["mode"] == "null" and r.get("sps")):
        cpu = null.get("cpu_us_per_step")
        lines += [f"Framework overhead (null env, MLP {null['hidden_size']}, {layout(null)} envs): "
                  f"{null['us_per_step_per_core']:.1f} us per agent step per core (cores x 1e6 / {null['sps']:,.0f} "
                  f"agent steps/s)" + (f"; {cpu:.1f} us of CPU actually used per agent step." if cpu else "."), ""]
    if any(r.get("scaling") for r in records):
        scaling_env = next(r["env"] for r in records if r.get("scaling"))
        lines += [*scaling_table(records, scaling_env), ""]
    for r in records:
        if r.get("over_one_policy"):
            lines += [f"{r['env']}: train frames/s with {r['label']} / with one policy (same env and layout): "
                      f"{r['over_one_policy']:.2f}", ""]
        if r["mode"] == "ray_train" and r.get("sps"):
            st = r.get("stages") or {}
            share, mb, slots = st.get("remote_share"), st.get("remote_bytes_per_s"), st.get("remote_slots_per_s")
            lines += [f"{r['env']} through Ray ({layout(r)} local, {r['label']}): train frames/s / all-local train "
                      f"row: {_num(r.get('over_local_train'), '.2f')}; through Ray {_num(mb and mb / 1e6, '.1f')} "
                      f"MB/s in {_num(slots, '.1f')} slots/s, {_num(share and 100 * share, '.0f')}% of the steps, "
                      f"arrival lag {_num(st.get('remote_lag_mean'), '.1f')} versions", ""]
        if r.get("over_feed_forward"):
            sf2 = r.get("asyncrl_over_sf2")
            lines += [f"{r['env']}: train frames/s with {r['label']} / feed-forward (same env and layout): "
                      f"{r['over_feed_forward']:.2f}"
                      + (f"; asyncrl {r['label']} / Sample Factory 2 with its GRU: {sf2:.2f}" if sf2 else ""), ""]
    lines += replay_table(records)
    return "\n".join(lines)
