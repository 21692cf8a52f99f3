"""`asyncrl-sweep FILE` for a file with `search`: open (or resume) the study, run the trials, write the results."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable

from asyncrl.search.spec import SearchSpec
from asyncrl.search.study import group_dir, open_study, recover_stale, storage_url, study_exists
from asyncrl.sweep import SweepError, cores_per_run


def check_start(spec: SearchSpec) -> None:
    """Refuse, before anything starts, a new study whose group already holds trial directories."""
    if not study_exists(spec):
        old = glob.glob(os.path.join(group_dir(spec), "trial-*"))
        if old:
            raise SweepError(f"{old[0]} already exists but the group has no study at {storage_url(spec)}; remove "
                             f"the trial directories or give the search another group")


def header(spec: SearchSpec, slots: int, cores: int | None = None) -> str:
    share = cores_per_run(slots * len(spec.seeds), cores)
    ranges = ", ".join(f"{r.name} {r.kind} " + (str(list(r.choices)) if r.kind == "choice" else
                                                 f"[{r.low:g}, {r.high:g}]") for r in spec.ranges)
    p = spec.pruner
    pruner = "no pruner" if p.kind == "none" else f"{p.kind} pruner from {p.min_frames:,} frames, every {p.every:,}"
    return (f"asyncrl-sweep: search of {spec.trials} trials x {len(spec.seeds)} seed(s) over {ranges}; "
            f"{spec.objective.direction} {spec.objective.metric} (last {spec.objective.last} records); "
            f"{spec.sampler} sampler, {pruner}; {slots} trial(s) at once, {share} core(s) per run; "
            f"study {spec.group} at {storage_url(spec)}")


def run_search(spec: SearchSpec, concurrent: int, dry_run: bool, entry: Callable[[list[str]], int],
               out: Callable[..., None] = print) -> int:
    """Run (or resume) the search, each run `entry(ARGS)` (asyncrl-train's command-line entry) in a fork of this
    process; its exit code (0 done, 1 a trial failed, 130 stopped by Ctrl-C)."""
    from asyncrl.search.results import write_results
    from asyncrl.search.trials import Search

    slots = max(1, concurrent // len(spec.seeds))  # a trial's seeds run side by side
    out(header(spec, slots), flush=True)
    if dry_run:
        return 0
    study, resumed = open_study(spec, slots)
    stale = recover_stale(study)
    if resumed:
        done = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        out(f"asyncrl-sweep: resuming: {done} trial(s) ended before"
            + (f"; trial(s) {stale} were left running by a search that was killed: failed, their settings asked "
               f"again" if stale else ""), flush=True)
    code = Search(spec, study, slots, entry, out=out).run()
    for line in write_results(spec, study):
        out(line, flush=True)
    if code == 130:
        out("asyncrl-sweep: stopped; run the same command to resume the search", flush=True)
    return code
