"""What a search leaves in its group's directory: the best settings as a `--config` file (best.yaml), the table of
trials (trials.md), a summary (summary.json), and Optuna's history and importance plots (history.png,
importance.png)."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import yaml

from asyncrl.search.progress import interval
from asyncrl.search.spec import SearchSpec
from asyncrl.search.study import group_dir, require_optuna
from asyncrl.search.trials import trial_name


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def objective_cell(t: Any) -> str:
    """`mean [low, high]` over the seeds of a finished trial; a pruned trial's last reported value."""
    seeds = t.user_attrs.get("seed_values")
    if t.state.name == "COMPLETE" and seeds:
        ci = interval(seeds)
        return _fmt(t.value) + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")
    if t.state.name == "PRUNED" and t.intermediate_values:
        return f"({_fmt(t.intermediate_values[max(t.intermediate_values)])})"
    return ""


def state_cell(t: Any, retried_as: dict[int, int]) -> str:
    if t.state.name == "PRUNED":
        return f"pruned at {t.user_attrs.get('pruned_at', 0):,}"
    if t.state.name == "FAIL" and t.number in retried_as:
        return f"interrupted, asked again as {trial_name(retried_as[t.number])}"
    if t.state.name == "FAIL":
        return "failed: " + str(t.user_attrs.get("error", "")).replace("|", "/")[:80]
    return t.state.name.lower()


def table(spec: SearchSpec, trials: list[Any]) -> str:
    """A Markdown table: one row per trial, its settings, objective (95% t interval over seeds), state, env steps."""
    names = [r.name for r in spec.ranges]
    retried_as = {t.user_attrs["retry_of"]: t.number for t in trials if "retry_of" in t.user_attrs}
    head = ["trial", *names, f"{spec.objective.metric} (95% CI over {len(spec.seeds)} seed(s))", "state",
            "env steps"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in trials:
        params = t.params or t.system_attrs.get("fixed_params", {})  # a waiting trial: the settings queued for it
        cells = [trial_name(t.number), *(_fmt(params.get(n, "")) for n in names), objective_cell(t),
                 state_cell(t, retried_as), f"{t.user_attrs.get('env_steps', 0):,}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def summary(spec: SearchSpec, trials: list[Any], best: Any | None) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    return {"group": spec.group, "metric": spec.objective.metric, "direction": spec.objective.direction,
            "trials": counts, "env_steps": sum(int(t.user_attrs.get("env_steps", 0)) for t in trials),
            "best": None if best is None else {"trial": best.number, "value": best.value, "params": best.params,
                                               "seed_values": best.user_attrs.get("seed_values")}}


def best_config(spec: SearchSpec, best: Any) -> str:
    """The base flags and the best trial's settings, as `asyncrl-train --config` reads them."""
    seeds = best.user_attrs.get("seed_values") or []
    ci = interval(seeds)
    flags = {**spec.base, **best.params}
    path = os.path.join(group_dir(spec), "best.yaml")
    head = (f"# asyncrl-sweep {spec.group}: {trial_name(best.number)}, {spec.objective.metric} (mean of the last "
            f"{spec.objective.last} records) {best.value:.4g}" + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")
            + f" over seeds {spec.seeds}\n# asyncrl-train --config {path}\n")
    return head + yaml.safe_dump(flags, sort_keys=False)


def plots(study: Any, directory: str) -> list[str]:
    """history.png and importance.png; a note for each that cannot be drawn (too few finished trials)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    notes = []
    for name, draw in (("history.png", ovm.plot_optimization_history), ("importance.png", ovm.plot_param_importances)):
        try:
            with warnings.catch_warnings(record=True) as caught:  # "too few trials to compute importances"
                warnings.simplefilter("always", UserWarning)
                ax = draw(study)
            fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
            fig.set_size_inches(8, 5)
            fig.tight_layout()
            fig.savefig(os.path.join(directory, name), dpi=100)
            plt.close(fig)
            notes += [f"{name}: {w.message}" for w in caught if issubclass(w.category, UserWarning)]
        except Exception as exc:  # noqa: BLE001 - importance needs two finished trials whose settings differ
            notes.append(f"{name} not drawn: {' '.join(str(exc).split())[:160]}")
    return notes


def write_results(spec: SearchSpec, study: Any) -> list[str]:
    """Write the group's result files; the lines to print."""
    optuna = require_optuna()
    directory = group_dir(spec)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_trial if done else None
    with open(os.path.join(directory, "trials.md"), "w") as f:
        f.write(table(spec, trials))
    info = summary(spec, trials, best)
    with open(os.path.join(directory, "summary.json"), "w") as f:
        json.dump(info, f, indent=1)
    lines = [table(spec, trials).rstrip()]
    counts = ", ".join(f"{n} {s}" for s, n in info["trials"].items())
    lines.append(f"asyncrl-sweep: {counts}; {info['env_steps']:,} env steps in all")
    if best is not None:
        with open(os.path.join(directory, "best.yaml"), "w") as f:
            f.write(best_config(spec, best))
        lines.append(f"asyncrl-sweep: best {trial_name(best.number)} {spec.objective.metric} {best.value:.4g}; "
                     f"its settings: {os.path.join(directory, 'best.yaml')} (asyncrl-train --config FILE)")
    lines += [f"asyncrl-sweep: {n}" for n in plots(study, directory)]
    lines.append(f"asyncrl-sweep: table {os.path.join(directory, 'trials.md')}, plots history.png and "
                 f"importance.png; compare the trials with: asyncrl-compare {os.path.join(directory, 'trial-*')}")
    return lines
