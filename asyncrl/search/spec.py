"""A search sweep file: the settings' ranges, the objective, the trials, the sampler, the pruner and the storage.

Checked before anything starts (SweepError, one line); needs neither Optuna nor torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

from asyncrl.config import Config
from asyncrl.diagnostics.tb_tags import EXACT
from asyncrl.sweep import SweepError, normalize_flags, parse_group, parse_seeds, refuse_inapplicable

KEYS = ("base", "search", "objective", "trials", "seeds", "group", "sampler", "sampler_seed", "pruner", "storage")
RANGE_KINDS = ("log", "uniform", "int", "choice")
SAMPLERS = ("tpe", "random", "qmc", "gp")
PRUNERS = ("median", "halving", "none")
METRIC_PREFIXES = ("info_", "eval_")  # the env's own metrics and evaluation figures: their names vary by env
BUDGET_KEYS = ("frames",)  # each trial's budget, and the pruner's resource: set in base, never searched


@dataclass(frozen=True)
class Range:
    """One setting's range: `log`/`uniform` floats, `int` whole numbers in [low, high], or a `choice` of values."""

    name: str  # Config field name
    kind: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Objective:
    metric: str  # a metrics.jsonl key
    last: int = 5  # a run's score: the mean of the metric over its last `last` records that have it
    direction: str = "maximize"


@dataclass(frozen=True)
class PrunerSpec:
    kind: str  # halving, median or none
    every: int  # frames between the values reported to the pruner (its steps)
    min_frames: int  # halving: the first rung; median: no pruning before it
    reduction: int = 3  # halving's reduction factor
    startup: int = 4  # median: trials that finish before any is pruned


@dataclass
class SearchSpec:
    group: str
    base: dict[str, Any]
    ranges: list[Range]
    objective: Objective
    trials: int
    seeds: list[int]
    sampler: str
    sampler_startup: int | None  # random trials before TPE's or GP's model; None: Optuna's default
    sampler_seed: int | None
    pruner: PrunerSpec
    storage: str | None  # an RDB URL; None: SQLite in the group's directory
    train_dir: str

    def fingerprint(self) -> dict[str, Any]:
        """What a resumed study must share with the one it resumes (the trial count may grow)."""
        return {"base": self.base, "search": [dataclasses.asdict(r) for r in self.ranges],
                "objective": dataclasses.asdict(self.objective), "seeds": self.seeds}


def _number(value: Any, where: str) -> float:
    """A finite number; YAML reads `1e-3` as a string, which is taken as the number it spells."""
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise SweepError(f"{where}: {value!r} is not a finite number")
    return x


def _whole(value: Any, where: str, minimum: int = 0) -> int:
    x = _number(value, where)
    if x != int(x) or x < minimum:
        raise SweepError(f"{where} must be a whole number of at least {minimum}, not {value!r}")
    return int(x)


def parse_range(name: str, value: Any) -> Range:
    """`{log: [low, high]}`, `{uniform: [low, high]}`, `{int: [low, high]}` or `{choice: [values]}`."""
    where = f"search: {name}"
    shape = "{log: [low, high]}, {uniform: [low, high]}, {int: [low, high]} or {choice: [values]}"
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in RANGE_KINDS:
        raise SweepError(f"{where}: a range is one of {shape}, not {value!r}")
    kind, bounds = next(iter(value.items()))
    if kind == "choice":
        if not isinstance(bounds, list) or not bounds:
            raise SweepError(f"{where}: choice takes a non-empty list of values")
        return Range(name, kind, choices=tuple(bounds))
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise SweepError(f"{where}: {kind} takes [low, high], not {bounds!r}")
    low, high = (_number(b, where) for b in bounds)
    if low > high:
        raise SweepError(f"{where}: low {bounds[0]} is above high {bounds[1]}")
    if kind == "log" and low <= 0:
        raise SweepError(f"{where}: a log range must lie above 0, not [{bounds[0]}, {bounds[1]}]; "
                         f"use uniform for a range through 0")
    field_type = {f.name: str(f.type) for f in dataclasses.fields(Config)}.get(name, "")
    if kind == "int":
        if low != int(low) or high != int(high):
            raise SweepError(f"{where}: int takes whole-number bounds, not [{bounds[0]}, {bounds[1]}]")
    elif field_type == "int":
        raise SweepError(f"{where}: --{name.replace('_', '-')} takes whole numbers; use {{int: [low, high]}} "
                         f"or a choice")
    return Range(name, kind, low, high)


def check_metric(metric: Any) -> str:
    """A metrics.jsonl key: one asyncrl writes, an env's `info_<key>`, an evaluation's `eval_<key>`, or one policy's
    `policy_<k>/<key>`."""
    if not isinstance(metric, str) or not metric:
        raise SweepError("objective: 'metric' must name a metrics.jsonl key, e.g. episode_return_mean")
    if metric in EXACT or metric.startswith(METRIC_PREFIXES) or "/" in metric:
        return metric
    close = difflib.get_close_matches(metric, list(EXACT), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise SweepError(f"objective: unknown metric {metric!r}; {hint}metrics.jsonl has e.g. episode_return_mean, "
                     f"episode_len_mean, info_<key> (the env's own) and eval_<key> (--eval-every)")


def parse_objective(value: Any) -> Objective:
    """`{metric: KEY, last: N, direction: maximize|minimize}`."""
    if not isinstance(value, dict) or "metric" not in value:
        raise SweepError("a search needs 'objective: {metric: KEY, last: N, direction: maximize|minimize}'")
    unknown = set(value) - {"metric", "last", "direction"}
    if unknown:
        raise SweepError(f"objective: unknown key(s) {sorted(unknown)}; it has metric, last and direction")
    direction = value.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise SweepError(f"objective: direction is maximize or minimize, not {direction!r}")
    return Objective(check_metric(value["metric"]), _whole(value.get("last", 5), "objective: last", 1), direction)


def parse_pruner(value: Any, frames: int) -> PrunerSpec:
    """`median` (default), `halving`, `none`, or `{type: ..., every: F, min_frames: F, reduction: R, startup: N}`;
    by default a value every tenth of the budget, and no pruning before a quarter of it."""
    value = {"type": value} if isinstance(value, str) or value is None else value
    if not isinstance(value, dict):
        raise SweepError(f"pruner: one of {', '.join(PRUNERS)}, or a mapping with 'type', not {value!r}")
    value = {str(k).replace("-", "_"): v for k, v in value.items()}
    unknown = set(value) - {"type", "every", "min_frames", "reduction", "startup"}
    if unknown:
        raise SweepError(f"pruner: unknown key(s) {sorted(unknown)}; it has type, every, min_frames, reduction, "
                         f"startup")
    kind = value.get("type") or "median"
    if kind not in PRUNERS:
        raise SweepError(f"pruner: type is one of {', '.join(PRUNERS)}, not {kind!r}")
    every = _whole(value.get("every", max(1, frames // 10)), "pruner: every", 1)
    min_frames = _whole(value.get("min_frames", max(every, frames // 4)), "pruner: min_frames", 1)
    if min_frames > frames:
        raise SweepError(f"pruner: min_frames {min_frames:,} is beyond the trials' budget (frames {frames:,})")
    return PrunerSpec(kind, every, min_frames, _whole(value.get("reduction", 3), "pruner: reduction", 2),
                      _whole(value.get("startup", 4), "pruner: startup", 0))


def parse_sampler(value: Any) -> tuple[str, int | None]:
    """`tpe` (default), `random`, `qmc`, `gp`, or `{type: tpe|gp, startup: N}`: N random trials before the model
    (Optuna's default 10 for TPE, which a search of 12 trials spends almost whole on random draws)."""
    value = {"type": value} if isinstance(value, str) or value is None else value
    if not isinstance(value, dict) or set(value) - {"type", "startup"}:
        raise SweepError(f"sampler: one of {', '.join(SAMPLERS)}, or {{type: tpe, startup: N}}, not {value!r}")
    kind = value.get("type") or "tpe"
    if kind not in SAMPLERS:
        raise SweepError(f"sampler: one of {', '.join(SAMPLERS)}, not {kind!r}")
    startup = value.get("startup")
    if startup is not None and kind not in ("tpe", "gp"):
        raise SweepError(f"sampler: startup is for tpe and gp, not {kind}")
    return kind, None if startup is None else _whole(startup, "sampler: startup", 1)


def parse_search(data: dict[str, Any], default_group: str) -> SearchSpec:
    """Check a loaded search sweep file; one-line SweepError on anything wrong."""
    unknown = set(data) - set(KEYS)
    if unknown:
        raise SweepError(f"unknown key(s) {sorted(unknown)}; a search sweep file has {', '.join(KEYS)}")
    base, search = data.get("base") or {}, data.get("search")
    if not isinstance(base, dict) or not isinstance(search, dict) or not search:
        raise SweepError("'base' must map flags to values and 'search' flags to ranges, e.g. "
                         "search: {lr: {log: [1.0e-4, 1.0e-2]}}")
    base, search = normalize_flags(base, "base"), normalize_flags(search, "search")
    searched_budget = [k for k in search if k in BUDGET_KEYS]
    if searched_budget:
        raise SweepError(f"search: {searched_budget[0]} is each trial's budget; set it in base")
    frames = _whole(base.get("frames", 0), "base: frames", 0)
    if frames < 1:
        raise SweepError("a search needs base: {frames: N}, each run's budget (and the pruner's yardstick)")
    ranges = [parse_range(name, value) for name, value in search.items()]
    refuse_inapplicable(base, {r.name: list(r.choices) if r.kind == "choice" else [None] for r in ranges})
    trials = _whole(data.get("trials", 0), "'trials'", 1) if "trials" in data else None
    if trials is None:
        raise SweepError("a search needs 'trials: N', the number of trials to finish")
    sampler, startup = parse_sampler(data.get("sampler"))
    sampler_seed = data.get("sampler_seed")
    if sampler_seed is not None:
        sampler_seed = _whole(sampler_seed, "sampler_seed")
    storage = data.get("storage")
    if storage is not None and (not isinstance(storage, str) or "://" not in storage):
        raise SweepError(f"storage: an RDB URL such as postgresql://user@host/db or sqlite:///path.db, "
                         f"not {storage!r}")
    train_dir = str(base.pop("train_dir", "train_dir"))
    return SearchSpec(parse_group(data, default_group), base, ranges, parse_objective(data.get("objective")),
                      trials, parse_seeds(data), sampler, startup, sampler_seed,
                      parse_pruner(data.get("pruner"), frames), storage, train_dir)
