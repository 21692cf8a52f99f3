"""The env specs of one start, each made once: resolution (the preset, multi-agent columns, --scale's memory fit)
and the preflight ask the same `EnvSpecs`, which builds an env to read its spaces only the first time a spec is
asked for. Keyed on the env and the options its backend reads (asyncrl/envs/registry.py:BACKENDS), so settings
that change the env get a spec of their own; an env that cannot be made raises the same error at every ask."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from asyncrl.config import Config, parse_env_kwargs
from asyncrl.envs.base import EnvSpec

SpecKey = tuple[str, tuple[tuple[str, str], ...]]
_DEFAULTS = Config()


class EnvSpecs:
    """`get(settings)`: the `EnvSpec` of the env `settings` name (a Config or a mapping of its fields), made once."""

    def __init__(self) -> None:
        self._made: dict[SpecKey, EnvSpec | Exception] = {}

    def get(self, settings: Config | Mapping[str, Any]) -> EnvSpec:
        key = spec_key(settings)
        if key not in self._made:
            from asyncrl.envs import registry  # looked up at each call: the registry's current make_env_spec

            try:
                self._made[key] = registry.make_env_spec(settings)
            except Exception as exc:  # noqa: BLE001 - kept, and raised again at the next ask
                self._made[key] = exc
        made = self._made[key]
        if isinstance(made, Exception):
            raise made
        return made


def spec_key(settings: Config | Mapping[str, Any]) -> SpecKey:
    """The env's name and the options its backend reads, as text (a mapping's missing fields: Config defaults)."""
    from asyncrl.envs.registry import backend_for

    def value(name: str) -> Any:
        if isinstance(settings, Mapping):
            return settings.get(name, getattr(_DEFAULTS, name))
        return getattr(settings, name)

    env = str(value("env"))
    options = tuple((name, _text(name, value(name))) for name in backend_for(env).options)
    return env, options


def _text(name: str, value: Any) -> str:
    """An option as comparable text: --env-kwargs by its parsed contents (JSON text or a mapping alike)."""
    if name == "env_kwargs" and isinstance(value, str):
        try:
            value = parse_env_kwargs(value)
        except ValueError:  # malformed: the make itself reports it
            return value
    return json.dumps(value, sort_keys=True, default=repr)
