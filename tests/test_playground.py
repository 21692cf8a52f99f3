"""`playground:` (asyncrl/envs/playground_env.py): the one line without the extra. Stepping a Playground env costs
over 30 s of JAX and Warp compilation on this CPU, past this suite's budget: scripts/envpool_check.py
(`playground_cartpole`) steps and trains one through asyncrl-train, and docs/env-backends.md has its figures."""

from __future__ import annotations

import sys

import pytest

from asyncrl.envs.base import EnvError
from asyncrl.envs.registry import make_env_spec, make_vec_env


def test_without_the_extra_a_playground_env_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mujoco_playground", None)  # as if not installed
    for make in (make_env_spec, lambda name: make_vec_env(name, 2)):
        with pytest.raises(EnvError, match=r"^'playground:CartpoleBalance' needs the playground extra .*"
                                           r"pip install -e '\.\[playground\]' in the asyncrl checkout$"):
            make("playground:CartpoleBalance")
