"""Soak test: train Pong for N minutes, sample every process's memory about every 10 s, report the growth.

Usage: scripts/soak.sh MINUTES [asyncrl-train flags...]   (or: python scripts/soak.py --minutes N -- FLAGS)

Memory is sampled per process title (asyncrl-runner, asyncrl-learner, asyncrl-policy-0, asyncrl-rollout-3, ...)
as RSS and as PSS (shared pages split between the processes that map them: the shared trajectory buffer is
counted once, not once per process). Growth is measured from the end of the warm-up (the first
`--warmup` fraction of the run, at least 60 s: buffers get touched, allocators fill their caches) to the end,
each end the median of a quarter of the samples (at least three; the learner's batches make single samples
swing by tens of MB). Samples taken while processes start or stop are left out. Exit code 1 if the total PSS
grew more than `--limit` percent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FLAGS = ["--env", "atari_pong", "--report-interval", "10", "--checkpoint-interval", "120"]


def sample(runner: psutil.Process) -> dict[str, dict[str, float]]:
    """{title: {"rss_mb", "pss_mb", "pid"}} for the runner and each of its descendants."""
    out: dict[str, dict[str, float]] = {}
    for proc in [runner, *runner.children(recursive=True)]:
        try:
            title = "asyncrl-runner" if proc.pid == runner.pid else proc.cmdline()[0]
            info = proc.memory_full_info()
        except (psutil.Error, IndexError):
            continue
        out[title] = {"rss_mb": info.rss / 2**20, "pss_mb": getattr(info, "pss", info.rss) / 2**20, "pid": proc.pid}
    return out


def median_of(samples: list[dict[str, dict[str, float]]], title: str, key: str) -> float | None:
    values = [s[title][key] for s in samples if title in s]
    return statistics.median(values) if values else None


def report(samples: list[tuple[float, dict]], warmup_s: float, limit: float) -> int:
    full = max((len(s) for _, s in samples), default=0)  # every process up (not starting or stopping)
    after = [(t, s) for t, s in samples if t >= warmup_s and len(s) == full]
    if len(after) < 6:
        print(f"soak: only {len(after)} samples after the {warmup_s:.0f} s warm-up; run longer", file=sys.stderr)
        return 2
    n = max(3, len(after) // 4)
    start, end = [s for _, s in after[:n]], [s for _, s in after[-n:]]
    titles = sorted(set(start[0]) | set(end[-1]))
    restarted = sorted(t for t in titles if len({s[t]["pid"] for _, s in after if t in s}) > 1)
    print(f"\n{'process':<22} {'rss start':>10} {'rss end':>10} {'pss start':>10} {'pss end':>10} {'pss growth':>11}")
    totals = {"rss": [0.0, 0.0], "pss": [0.0, 0.0]}
    for title in titles:
        row = {}
        for key in ("rss", "pss"):
            a, b = median_of(start, title, f"{key}_mb"), median_of(end, title, f"{key}_mb")
            row[key] = (a, b)
            if a is not None and b is not None:
                totals[key][0] += a
                totals[key][1] += b
        (ra, rb), (pa, pb) = row["rss"], row["pss"]
        growth = f"{100 * (pb - pa) / pa:+.1f}%" if pa and pb is not None else "-"
        print(f"{title:<22} {ra or 0:>10.1f} {rb or 0:>10.1f} {pa or 0:>10.1f} {pb or 0:>10.1f} {growth:>11}")
    growth = {key: 100 * (b - a) / a if a else 0.0 for key, (a, b) in totals.items()}
    minutes = (after[-1][0] - after[0][0]) / 60
    print(f"{'total':<22} {totals['rss'][0]:>10.1f} {totals['rss'][1]:>10.1f} {totals['pss'][0]:>10.1f} "
          f"{totals['pss'][1]:>10.1f} {growth['pss']:>+10.1f}%")
    print(json.dumps({"minutes_measured": round(minutes, 2), "warmup_s": warmup_s, "samples": len(after),
                      "pss_growth_pct": round(growth["pss"], 2), "rss_growth_pct": round(growth["rss"], 2),
                      "restarted": restarted}))
    return 0 if growth["pss"] <= limit else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run ignored (at least 60 s)")
    parser.add_argument("--limit", type=float, default=5.0, help="allowed total PSS growth, percent")
    parser.add_argument("flags", nargs="*", help="extra asyncrl-train flags (after --)")
    args = parser.parse_args(argv)
    seconds = args.minutes * 60
    train = Path(sys.executable).with_name("asyncrl-train")
    cmd = [str(train) if train.exists() else "asyncrl-train", *DEFAULT_FLAGS, *args.flags, "--seconds", str(seconds)]
    with tempfile.TemporaryDirectory(prefix="asyncrl-soak-") as train_dir:
        cmd += ["--train-dir", train_dir]
        print("soak:", " ".join(cmd), flush=True)
        proc = subprocess.Popen(cmd)
        runner = psutil.Process(proc.pid)
        t0 = time.monotonic()
        samples: list[tuple[float, dict]] = []
        try:
            while proc.poll() is None:
                snapshot = sample(runner)
                if len(snapshot) > 1:
                    now = time.monotonic() - t0
                    samples.append((now, snapshot))
                    total = sum(p["pss_mb"] for p in snapshot.values())
                    print(f"soak: {now:6.0f} s  {len(snapshot)} processes  PSS {total:8.1f} MB", flush=True)
                time.sleep(args.interval)
        except KeyboardInterrupt:
            proc.terminate()
        code = proc.wait()
        if code:
            print(f"soak: asyncrl-train exited with code {code}", file=sys.stderr)
            return 2
    return report(samples, max(60.0, args.warmup * seconds), args.limit)


if __name__ == "__main__":
    sys.exit(main())
