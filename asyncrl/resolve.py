"""Settings resolution: the command line, a --config file, the env family's preset, --scale and a resumed run's
saved config.json, resolved into one `asyncrl.config.Config`.

Command line > --config FILE > the env family's preset (asyncrl.presets) > Config defaults; with --resume the
run's config.json takes the place of the preset and the defaults. A resolution (`Resolution`) keeps the env specs
it made (`asyncrl.spec_memo`) and the config.json it read, for the preflight and the resume lines to reuse.
Importing this module stays cheap (no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from asyncrl.config import (
    ALGOS,
    LOCKSTEP_ONES,
    PPO_ONLY,
    REPLAY_ONLY,
    SERIAL_ONES,
    Config,
    ConfigError,
    applies_to,
    check_applicable,
    check_experiment_name,
    parse_env_kwargs,
)
from asyncrl.models.registry import is_user_encoder
from asyncrl.presets import PRESETS, preset_for
from asyncrl.spec_memo import EnvSpecs
from asyncrl.system import available_memory, usable_cpus

RESUME_KEEPS_GIVEN = ("train_dir", "experiment", "resume")  # they find the run; never taken from its config.json


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (exit code 2), like every other configuration error, with the flag meant when a
    given one is misspelt and the --env form of a bare positional word."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}{self.hint(message)}\n")

    def hint(self, message: str) -> str:
        """` (did you mean --frames? ...)` for an unrecognised flag, the --env form of a bare word, or the
        reminder that flags are spelled out in full."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return " (see --help)"
        words = message[len(prefix):].split()
        flags = [w.split("=")[0] for w in words if w.startswith("--")]
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for flag in flags:
            names = known if flag.startswith("--no-") else [k for k in known if not k.startswith("--no-")]
            close = [k for k in names if k.startswith(flag)][:3] or difflib.get_close_matches(flag, names, n=1)
            if close:
                meant = " or ".join([", ".join(close[:-1]), close[-1]] if len(close) > 1 else close)
                return f" (did you mean {meant}? flags are spelled out in full; see --help)"
        if not flags and words:
            return (f" ({self.prog} takes no positional arguments: to train on an env give --env {words[0]}; "
                    "see --help)")
        return " (flags are spelled out in full; see --help)"


def count(text: str) -> int:
    """An integer setting: `1000000`, `1_000_000` and `1e6` (a whole number in float notation) alike."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise ValueError(text) from None
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


count.__name__ = "int"  # argparse's message: "invalid int value: '1.5e0x'"

# --help's sections for the settings of every --algo, by what they are for; each algorithm's own settings follow
# under its heading (`help_groups`). A field of every --algo not named here lands under "other settings".
TASKS: dict[str, tuple[str, ...]] = {
    "what to train": ("env", "env_kwargs", "algo", "hidden_size", "max_episode_frames", "info_keys",
                      "doom_measurements"),
    "how long, and where the run goes": ("frames", "seconds", "seed", "train_dir", "experiment", "resume", "train"),
    "learning (every --algo)": ("batch_size", "lr", "lr_scaling", "lr_reference_batch", "gamma"),
    "speed: processes, envs and devices": ("workers", "envs_per_worker", "worker_splits", "policy_workers",
                                           "rollout", "env_threads", "env_vectorization", "device", "serial",
                                           "learner_threads", "policy_nice", "rollout_nice"),
    "past one machine: remote actor groups on a Ray cluster": ("ray", "remote_workers", "remote_envs_per_worker",
                                                               "remote_cpus"),
    "evaluation, checkpoints and logging": ("eval_every", "eval_episodes", "eval_video", "report_interval",
                                            "dashboard", "checkpoint_interval", "keep_checkpoints", "wandb",
                                            "wandb_project", "wandb_entity", "wandb_group", "wandb_tags"),
    "failures and timeouts": ("hang_timeout", "dist_timeout", "max_env_error_rate"),
}
OTHER_TASK = "other settings (every --algo)"
USAGE = "%(prog)s --env ENV [--frames N] [--algo ALGO] [--FLAG VALUE ...]"

EXAMPLES = """examples:
  asyncrl-train --env CartPole-v1 --frames 300000         learn CartPole-v1 (train_dir/CartPole-v1)
  asyncrl-train --env CartPole-v1 --frames 1e6 --seed 3 --experiment cartpole_s3
  asyncrl-train --env CartPole-v1 --resume                continue train_dir/CartPole-v1 from its checkpoint
  asyncrl-train --env Pendulum-v1 --algo sac --frames 50000
  asyncrl-train --config run.yaml --print-config          the settings a run would use; nothing starts
afterwards: asyncrl-diagnose, asyncrl-plot, asyncrl-enjoy and asyncrl-export take the run directory
(train_dir/EXPERIMENT); docs/tools.md explains the console output."""


def task_of(name: str) -> str:
    """The --help section of a setting of every --algo (`TASKS`)."""
    return next((task for task, names in TASKS.items() if name in names), OTHER_TASK)


def build_parser(prog: str = "asyncrl-train") -> argparse.ArgumentParser:
    """One --flag per Config field, with the field's default, the presets that change it, and its help; plus
    --config FILE, --print-config and --version. The settings of every algorithm are grouped by task (`TASKS`),
    each algorithm's own under the heading of the algorithms they apply to (their `applies_to`, see
    `help_groups`), so a new field lands under its heading by declaring its "algos" once.

    Abbreviations are refused: `--gam` must not silently mean `--gamma` (and then lose to a preset).
    """
    from asyncrl.version import __version__

    parser = _OneLineParser(prog=prog, usage=USAGE, epilog=EXAMPLES, allow_abbrev=False,
                            description="Train an agent with asynchronous APPO + V-trace (or SAC, TD3, REDQ).",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="a YAML (.yaml, .yml) or JSON file of settings (keys: the flags' names, with - or _); "
                             "command-line flags win over it, it wins over the presets and defaults")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved configuration as JSON and exit (nothing is created)")
    defaults = Config()
    tasks = [*TASKS, OTHER_TASK]
    used = {task_of(f.name) for f in dataclasses.fields(Config) if f.metadata.get("cli", True)
            and applies_to(f) == ALGOS}
    sections = {task: parser.add_argument_group(task) for task in tasks if task in used}
    groups = {algos: parser.add_argument_group(help_group_title(algos)) for algos in help_groups()
              if algos != ALGOS}
    for f in dataclasses.fields(Config):
        if not f.metadata.get("cli", True):
            continue
        group = sections[task_of(f.name)] if applies_to(f) == ALGOS else groups[applies_to(f)]
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        presets = "".join(f"; {name} preset: {values[f.name]}" for name, values in PRESETS.items()
                          if f.name in values and values[f.name] != default)
        help_text = f.metadata.get("help", "").replace("%", "%%")
        if applies_to(f) != ALGOS:
            presets += f"; --algo {', '.join(applies_to(f))} only"
        if isinstance(default, bool):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                               help=f"{help_text} (default: %(default)s{presets})")
        else:
            kind = count if type(default) is int else type(default)
            group.add_argument(flag, dest=f.name, type=kind, default=default,
                               help=_with_default(help_text, default, presets))
    return parser


def _with_default(help_text: str, default: Any, presets: str) -> str:
    """`help (default: X; presets)`; an empty default is left out ("experiment name (default: the env name)"
    says it in words; "W&B group" has none)."""
    if default != "":
        return f"{help_text} (default: {default}{presets})"
    return f"{help_text} ({presets.removeprefix('; ')})" if presets else help_text


def help_groups() -> list[tuple[str, ...]]:
    """The --help sections, one per distinct `applies_to` of the command-line fields: the settings of every
    algorithm first (shown by task, `TASKS`), then the others in the order their first field is declared in
    Config."""
    seen = dict.fromkeys(applies_to(f) for f in dataclasses.fields(Config) if f.metadata.get("cli", True))
    return sorted(seen, key=lambda algos: algos != ALGOS)  # a stable sort keeps the declaration order


def help_group_title(algos: tuple[str, ...]) -> str:
    """The --help heading of the flags that apply to exactly `algos`, e.g. "APPO (--algo appo)"."""
    if algos == ALGOS:
        return "run, env and engine settings (every --algo)"
    names = ", ".join(a.upper() for a in algos)
    if len(algos) > 1 and set(algos) <= set(REPLAY_ONLY):
        names = f"off-policy: {names}"
    return f"{names} (--algo {', '.join(algos)})"


@dataclass(frozen=True)
class Resolution:
    """Resolved settings, with what resolving them read: the env specs made on the way (the preflight reuses them)
    and, on --resume, the run's saved config.json (None: none was read)."""

    config: Config
    specs: EnvSpecs = dataclasses.field(default_factory=EnvSpecs)
    saved: dict[str, Any] | None = None


@dataclass
class CommandLine:
    """What `asyncrl-train`'s command line asks for: the resolved settings, and whether only to print them."""

    resolution: Resolution
    print_config: bool = False

    @property
    def config(self) -> Config:
        return self.resolution.config


def parse_config(argv: list[str] | None = None) -> Config:
    """Command line > --config FILE > the env family's preset (asyncrl.presets) > Config defaults.

    With --resume the run's saved config.json takes the place of the preset and the defaults: what was not
    given on the command line or in the file stays as it was saved (see `resume_changes` for what changed).
    """
    return parse_command_line(argv).config


def parse_command_line(argv: list[str] | None = None) -> CommandLine:
    """parse_config, and the --print-config option."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = vars(parser.parse_args(words))
    config_file, print_config = args.pop("config"), args.pop("print_config")
    explicit = {k: v for k, v in args.items() if v != parser.get_default(k) or _given(k, words)}
    if "experiment" in explicit and not explicit["experiment"].strip():
        raise ConfigError("--experiment must not be blank; give a name or leave the flag out (the env's name)")
    return CommandLine(resolve_settings(explicit, config_file), print_config)


def config_from_flags(config: str | None = None, **flags: Any) -> Config:
    """The Python form of the command line: `config_from_flags(env="CartPole-v1", frames=150000)` resolves the
    same Config as `asyncrl-train --env CartPole-v1 --frames 150000` (flags > config file > preset > defaults)."""
    return resolve_flags(config, **flags).config


def resolve_flags(config: str | None = None, **flags: Any) -> Resolution:
    """config_from_flags, with what the resolution read (`Resolution`)."""
    return resolve_settings(check_settings(flags, "asyncrl.train()"), config)


def merge_config(explicit: dict[str, Any], config_file: str | None = None) -> Config:
    """Given settings (and a config file's, which they override) over the preset or the resumed run's config."""
    return resolve_settings(explicit, config_file).config


def resolve_settings(explicit: dict[str, Any], config_file: str | None = None) -> Resolution:
    """merge_config, with the env specs it made and the config.json it read (`Resolution`)."""
    specs = EnvSpecs()
    on_command_line = set(explicit)
    if config_file is not None:
        from_file = read_config_file(config_file)
        if "lr" in explicit:  # a given --lr is a new base rate, whatever the file recorded
            from_file.pop("lr_base", None)
        explicit = {**from_file, **explicit}
    if "experiment" in explicit:
        check_experiment_name(explicit["experiment"])
    args = {**dataclasses.asdict(Config()), **explicit}
    saved = read_saved_config(args) if args["resume"] else None
    preset: dict[str, Any] = {}
    if saved is not None:
        base = {**args, **saved, **{k: args[k] for k in RESUME_KEEPS_GIVEN}}
    else:
        preset = preset_for(args["env"], parse_env_kwargs(args["env_kwargs"]), args["algo"], args["env_vectorization"],
                            specs)
        base = {**args, **preset}
    scale = explicit.get("scale", base.get("scale", ""))
    if scale and (saved is None or "scale" in explicit):  # a resumed run's config.json already holds its scale
        base.update(scaled(scale, {**base, **explicit}, explicit, specs))
    merged = {**base, **explicit}
    check_applicable(merged["algo"], [k for k, v in explicit.items() if k in on_command_line or v != base.get(k)])
    if "lr" in explicit and "lr_base" not in explicit:
        merged["lr_base"] = 0.0  # the given --lr is the base rate that --lr-scaling scales
    if saved is None and preset.get("normalize_obs") and "normalize_obs" not in explicit and \
            is_user_encoder(str(merged.get("encoder", ""))):
        merged["normalize_obs"] = False  # a user's encoder reads the env's own frames unless --normalize-obs is given
    if saved is None and "batch_size" not in explicit:
        merged.update(whole_trajectories(merged))
    if saved is None:  # a resumed run's config.json holds the rule it resolved
        merged.update(default_lr_rule(merged, explicit, preset))
    if saved is None and "envs_per_worker" not in explicit:
        merged.update(agent_columns(merged, explicit, specs))
    if saved is None and merged.get("rnn") == "lstm" and merged["algo"] in PPO_ONLY and "center_values" not in explicit:
        merged["center_values"] = True  # an LSTM's cells run away on returns far from 0 without it (results.md)
    if merged.get("deterministic"):
        merged.update({k: 1 for k in LOCKSTEP_ONES if k not in explicit})  # validate() refuses a given one
    if merged.get("serial"):
        merged.update({k: 1 for k in SERIAL_ONES if k not in explicit})  # validate() refuses a given one
    return Resolution(Config(**merged).resolve(), specs, saved)


def agent_columns(settings: dict[str, Any], explicit: dict[str, Any],
                  specs: EnvSpecs | None = None) -> dict[str, Any]:
    """For a multi-agent env (each agent an env column), --envs-per-worker rounded up to whole env instances per
    worker split, and --batch-size (unless given) up to whole trajectories of them; {} for other envs. The env's
    spec comes from `specs` (the resolution's) where given."""
    try:
        agents = (specs or EnvSpecs()).get(settings).num_agents
    except Exception:  # a bad env name: the preflight says so with its own one-line error
        return {}
    splits, rollout = max(1, int(settings["worker_splits"])), max(1, int(settings["rollout"]))
    per_split = max(1, int(settings["envs_per_worker"]) // splits)
    if agents <= 1 or per_split % agents == 0:
        return {}
    per_split = -(-per_split // agents) * agents
    out: dict[str, Any] = {"envs_per_worker": per_split * splits}
    if "batch_size" not in explicit:
        trajectory = per_split * rollout
        out["batch_size"] = -(-int(settings["batch_size"]) // trajectory) * trajectory
    return out


def whole_trajectories(settings: dict[str, Any]) -> dict[str, Any]:
    """--batch-size (not given) rounded up to whole trajectories of the envs per split whose env columns split into
    the minibatches, as validate() requires: `--envs-per-worker 2048` needs no hand-computed batch. {} when it
    already divides (or envs are automatic)."""
    splits, rollout = max(1, int(settings["worker_splits"])), max(1, int(settings["rollout"]))
    per_split = int(settings["envs_per_worker"]) // splits
    batch = int(settings["batch_size"])
    if per_split < 1 or batch < 1 or batch % (per_split * rollout) == 0:
        return {}
    count = -(-batch // (per_split * rollout))
    minibatches = max(1, int(settings["minibatches"]))
    while (count * per_split) % minibatches:  # a minibatch is a set of whole env columns
        count += 1
    return {"batch_size": count * per_split * rollout}


def default_lr_rule(settings: dict[str, Any], explicit: dict[str, Any], preset: dict[str, Any]) -> dict[str, Any]:
    """The sqrt rule when neither --lr-scaling nor --lr is given and the global batch (--batch-size x ranks)
    exceeds the reference batch: {"lr_scaling": "sqrt", "lr_reference_batch": reference}; else nothing.

    The reference is the batch the base rate was set for: a given --lr-reference-batch, else the --scale row's
    envs x rollout, else the env family's preset batch (the Config default where the preset has none). APPO
    only: the replay learners' --batch-size is the env steps a train call inserts, not a gradient batch.
    A single rank on its preset's batch is at the reference, so its settings are left as they are.
    """
    from asyncrl.scaling import SCALES, world_size

    if "lr_scaling" in explicit or "lr" in explicit or settings["algo"] not in PPO_ONLY:
        return {}
    if "lr_reference_batch" in explicit:
        reference = int(explicit["lr_reference_batch"])
    elif settings.get("scale") in SCALES:
        row = SCALES[settings["scale"]]
        reference = row["envs"] * row["rollout"]
    else:
        reference = int(preset.get("batch_size", Config().batch_size))
    if reference < 1 or settings["batch_size"] * world_size() <= reference:
        return {}
    return {"lr_scaling": "sqrt", "lr_reference_batch": reference}


def scaled(scale: str, settings: dict[str, Any], explicit: dict[str, Any],
           specs: EnvSpecs | None = None) -> dict[str, Any]:
    """The `--scale` preset's settings for this machine (asyncrl.scaling.scale_settings); an unknown scale is left
    to validate()."""
    from asyncrl.scaling import SCALES, scale_settings, world_size

    if scale not in SCALES:
        return {"scale": scale}
    given = {k: explicit[k] for k in ("workers", "envs_per_worker", "rollout", "worker_splits") if k in explicit}
    batched, fits = _trajectories_fit(settings, specs)
    return {**scale_settings(scale, given, cores=usable_cpus(), world=world_size(), batched=batched, fits=fits),
            "scale": scale}


def _trajectories_fit(settings: dict[str, Any], specs: EnvSpecs | None = None) -> tuple[bool, Any]:
    """(the env is batched, fits(workers, envs_per_worker, rollout, splits): the trajectory buffer within 80% of
    free RAM, as the preflight checks); (False, always True) when the env cannot be described here (the preflight
    reports that)."""
    try:
        from asyncrl.models.registry import state_layout
        from asyncrl.runtime.plumbing.trajectories import trajectory_bytes

        spec = (specs or EnvSpecs()).get(settings)  # with the run's --env-kwargs and backend options
        state = state_layout(Config(**{k: settings[k] for k in ("rnn", "rnn_size", "rnn_layers") if k in settings}))
        available = available_memory()
    except Exception:  # a bad env name: the preflight says so with its own one-line error
        return False, lambda workers, envs, rollout, splits: True

    def fits(workers: int, envs: int, rollout: int, splits: int) -> bool:
        cfg = Config(workers=workers, envs_per_worker=envs, rollout=rollout, worker_splits=splits,
                     batch_size=workers * envs * rollout)
        return trajectory_bytes(cfg, spec, state) <= 0.8 * available  # with the recurrent state columns

    return spec.batched, fits


def read_config_file(path: str) -> dict[str, Any]:
    """A YAML (.yaml, .yml) or JSON file of settings, checked like the command line (ConfigError if not)."""
    from asyncrl.settings_file import SettingsFileError, load_settings_file

    where = f"--config {path}"
    try:
        data = load_settings_file(path)
    except SettingsFileError as exc:
        raise ConfigError(f"--config {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping of flag names to values, not a {type(data).__name__}")
    return check_settings(data, where)


def check_settings(values: dict[Any, Any], where: str) -> dict[str, Any]:
    """Settings keyed by Config field names (with - or _), each of its field's type; ConfigError otherwise.

    Integers are accepted for float fields, and so are numeric strings (YAML reads `1e-3` as a string); whole
    numbers in float notation for integer fields (`frames: 1.0e+6`, `asyncrl.train(frames=1e6)`).
    """
    fields = {f.name: f for f in dataclasses.fields(Config)}
    defaults = Config()
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" (did you mean {close[0]}?)" if close else " (keys are asyncrl-train's flags, e.g. batch_size)"
            raise ConfigError(f"{where}: unknown setting {key!r}{hint}")
        kind = type(getattr(defaults, name))
        if name == "env_kwargs" and isinstance(value, dict):  # a mapping in a config file or asyncrl.train()
            value = json.dumps(value)
        out[name] = _typed(value, kind, f"{where}: {key}")
    return out


def _typed(value: Any, kind: type, what: str) -> Any:
    if kind is int and isinstance(value, float) and value.is_integer():  # frames: 1e6 (JSON), asyncrl.train(frames=1e6)
        return int(value)
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    elif isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise ConfigError(f"{what} must be {_KIND_NAMES[kind]}, not {value!r}")


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def read_saved_config(args: dict[str, Any]) -> dict[str, Any] | None:
    """The config.json of the run `args` point at, as Config fields; None if there is none (a fresh start)."""
    name = args["experiment"] or Config(env=args["env"]).experiment_name
    path = os.path.join(args["train_dir"], name, "config.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--resume: cannot read {path} ({exc}); fix or remove it to resume with the presets "
                          f"and defaults") from None
    known = {f.name for f in dataclasses.fields(Config)}
    return {k: v for k, v in data.items() if k in known}


def resolution_of(cfg: Config) -> Resolution:
    """A Config resolved elsewhere as a `Resolution`: no env spec made yet, and on --resume its run's config.json."""
    args = {"experiment": cfg.experiment, "env": cfg.env, "train_dir": cfg.train_dir}
    return Resolution(cfg, EnvSpecs(), read_saved_config(args) if cfg.resume else None)


def resume_changes(cfg: Config, saved: dict[str, Any] | None = None) -> list[str]:
    """One `name: saved -> now` line per setting that differs from the run's saved config.json (on --resume):
    `saved` as the resolution read it (`Resolution.saved`), or read here when not given."""
    if not cfg.resume:
        return []
    if saved is None:
        saved = read_saved_config({"experiment": cfg.experiment, "env": cfg.env, "train_dir": cfg.train_dir}) or {}
    now = dataclasses.asdict(cfg)
    internal = {f.name for f in dataclasses.fields(Config) if not f.metadata.get("cli", True)}  # e.g. lr_base
    return [f"{k}: {saved[k]} -> {now[k]}" for k in now
            if k in saved and k not in RESUME_KEEPS_GIVEN and k not in internal and saved[k] != now[k]]


def _given(name: str, words: list[str]) -> bool:
    """True if the flag for field `name` appears on the command line (even with its default value)."""
    flag = "--" + name.replace("_", "-")
    return any(w == flag or w.startswith(flag + "=") or w == "--no-" + flag[2:] for w in words)
