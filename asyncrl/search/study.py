"""The Optuna study of a search: its storage (SQLite in the group's directory unless the file names an RDB URL),
sampler and pruner, the resumption of a stopped search, and the settings a trial suggests."""

from __future__ import annotations

import json
import os
import socket
import warnings
from typing import Any

from asyncrl.search.spec import PrunerSpec, Range, SearchSpec
from asyncrl.sweep import SweepError

DB_NAME = "study.db"
INSTALL_HINT = "pip install -e '.[sweep]' in the asyncrl checkout"


def require_optuna() -> Any:
    """The optuna module; SweepError naming the `sweep` extra if it is missing."""
    try:
        import optuna
    except ImportError:
        raise SweepError(f"a search needs Optuna, which is not installed: {INSTALL_HINT} (the 'sweep' extra)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def group_dir(spec: SearchSpec) -> str:
    return os.path.join(spec.train_dir, spec.group)


def storage_url(spec: SearchSpec) -> str:
    """The file's URL, or SQLite at TRAIN_DIR/GROUP/study.db."""
    return spec.storage or "sqlite:///" + os.path.abspath(os.path.join(group_dir(spec), DB_NAME))


def study_exists(spec: SearchSpec) -> bool:
    """Whether the group already has a study to resume (checked without creating a database)."""
    if spec.storage is None:
        return os.path.exists(os.path.join(group_dir(spec), DB_NAME))
    optuna = require_optuna()
    try:
        return spec.group in optuna.study.get_all_study_names(storage=spec.storage)
    except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver, an unreachable server
        raise SweepError(f"storage {spec.storage}: {' '.join(str(exc).split())[:200]}") from None


def make_sampler(spec: SearchSpec, concurrent_trials: int, seed_offset: int = 0) -> Any:
    """`seed_offset`: the trials a resumed study has, so a seeded sampler does not draw its first points again."""
    optuna = require_optuna()
    seed = None if spec.sampler_seed is None else spec.sampler_seed + seed_offset
    startup = {} if spec.sampler_startup is None else {"n_startup_trials": spec.sampler_startup}
    if spec.sampler == "tpe":  # constant liar: trials running side by side do not all ask for the same point
        return optuna.samplers.TPESampler(seed=seed, constant_liar=concurrent_trials > 1, **startup)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    return optuna.samplers.GPSampler(seed=seed, **startup)


def make_pruner(p: PrunerSpec) -> Any:
    """Steps are frames: every trial reports at the same multiples of `p.every`."""
    optuna = require_optuna()
    if p.kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_frames, reduction_factor=p.reduction)
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup, n_warmup_steps=p.min_frames)
    return optuna.pruners.NopPruner()


def open_study(spec: SearchSpec, concurrent_trials: int) -> tuple[Any, bool]:
    """Create the study, or load the group's and check that the file still describes it; (study, resumed)."""
    optuna = require_optuna()
    resumed = study_exists(spec)
    os.makedirs(group_dir(spec), exist_ok=True)
    try:
        study = optuna.create_study(storage=storage_url(spec), study_name=spec.group, load_if_exists=True,
                                    direction=spec.objective.direction,
                                    sampler=make_sampler(spec, concurrent_trials), pruner=make_pruner(spec.pruner))
    except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver, a direction other than the study's
        raise SweepError(f"study {spec.group} at {storage_url(spec)}: {' '.join(str(exc).split())[:200]}") from None
    if spec.sampler_seed is not None and study.trials:
        study.sampler = make_sampler(spec, concurrent_trials, len(study.trials))
    fingerprint = json.loads(json.dumps(spec.fingerprint()))
    stored = study.user_attrs.get("sweep")
    if stored is None:
        study.set_user_attr("sweep", fingerprint)
    elif stored != fingerprint:
        changed = sorted(k for k in fingerprint if fingerprint[k] != stored.get(k))
        raise SweepError(f"study {spec.group} was started with another {', '.join(changed)}; restore the file or "
                         f"give this search another group")
    return study, resumed


def owner() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_stale(study: Any) -> list[int]:
    """Trials this machine left RUNNING (its search was killed, not stopped): failed, their settings asked again.
    A RUNNING trial of another host, or of a live search here, is left alone. The numbers recovered."""
    optuna = require_optuna()
    stale = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        who = t.user_attrs.get("owner") or {}
        if who.get("host") == socket.gethostname() and not _alive(int(who.get("pid", -1))):
            retry(study, t.number, t.params)
            stale.append(t.number)
    return stale


def retry(study: Any, number: int, params: dict[str, Any]) -> None:
    """Fail a trial that did not run to its end (interrupted) and queue its settings as a new trial, whose
    `retry_of` names it."""
    optuna = require_optuna()
    study.tell(number, state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial(params, user_attrs={"retry_of": number}, skip_if_exists=False)


def suggest(trial: Any, ranges: list[Range]) -> dict[str, Any]:
    """The trial's settings, one per range."""
    params = {}
    for r in ranges:
        if r.kind == "choice":
            params[r.name] = trial.suggest_categorical(r.name, list(r.choices))
        elif r.kind == "int":
            params[r.name] = trial.suggest_int(r.name, int(r.low), int(r.high))
        else:
            params[r.name] = trial.suggest_float(r.name, r.low, r.high, log=r.kind == "log")
    return params
