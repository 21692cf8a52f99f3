"""VizDoom backend (`doom_<scenario>`), stepped directly with numpy buffers on real games.

Every test that starts a game checks afterwards that no VizDoom engine process is left.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from asyncrl.envs.base import EnvError, EpisodeStats
from asyncrl.envs.registry import make_env_spec, make_vec_env
from asyncrl.presets import preset_name

needs_vizdoom = pytest.mark.skipif(
    find_spec("vizdoom") is None, reason="vizdoom is not installed (pip install 'asyncrl[doom]')")
NOOP = 0
BLOCK_VIZDOOM = "import sys; sys.modules['vizdoom'] = None"  # `import vizdoom` now raises ImportError


class Buffers:
    """The arrays a rollout worker hands to step(), with a sentinel in final_obs to see which rows were written."""

    SENTINEL = 7

    def __init__(self, n: int) -> None:
        self.obs = np.zeros((n, 3, 72, 128), np.uint8)
        self.reward = np.full(n, np.nan, np.float32)
        self.terminated = np.ones(n, bool)
        self.truncated = np.ones(n, bool)
        self.final_obs = np.full((n, 3, 72, 128), self.SENTINEL, np.uint8)

    def step(self, env, actions) -> list[EpisodeStats]:  # noqa: ANN001 - DoomVecEnv, imported only with vizdoom
        return env.step(np.asarray(actions), self.obs, self.reward, self.terminated, self.truncated, self.final_obs)


def rendered(frame: np.ndarray) -> bool:
    """A frame the engine drew into a zeroed buffer: many shades, however dark the view (a contrast bar such as
    std > 10 failed once on a real frame facing a dark corner: 9.66)."""
    return int(np.count_nonzero(np.bincount(frame.ravel(), minlength=256))) > 16


def engines() -> list[psutil.Process]:
    """This process's VizDoom engines and engine watchdogs."""
    return [p for p in psutil.Process().children(recursive=True)
            if p.name() == "vizdoom" or "asyncrl-doom-watchdog" in p.cmdline()]


def vizdoom_shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("ViZDoom*")}


def mapped_by_a_live_process(names: set[str]) -> set[str]:
    """The entries some running process maps: another test's engines (this test's are gone when it is called)."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        mapped |= {name for name in names if f"/dev/shm/{name}" in text}
    return mapped


def leaked_shm(before: set[str]) -> set[str]:
    """VizDoom entries created since `before` that no running process maps, after up to 5 s for other tests'
    engines that are starting (created, not yet mapped) or closing (unmapped, not yet removed)."""
    deadline = time.monotonic() + 5
    while True:
        new = vizdoom_shm() - before
        leaked = new - mapped_by_a_live_process(new)
        if not leaked or time.monotonic() > deadline:
            return leaked
        time.sleep(0.1)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # killed; reaping is its new parent's job
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def doom() -> Iterator[list]:
    """Collects the envs a test makes; closes them and checks that their engine processes are gone."""
    from asyncrl.envs.doom import DoomVecEnv

    made: list[DoomVecEnv] = []
    shm_before = vizdoom_shm()
    yield made
    for env in made:
        env.close()
    deadline = time.monotonic() + 10
    while engines() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engines(), f"VizDoom engines left running: {engines()}"
    # other test files may run VizDoom at the same time: only entries that no engine maps any more are this test's
    assert not leaked_shm(shm_before), "close() left VizDoom shared memory in /dev/shm"


def make(doom: list, name: str, n: int, **kwargs):  # noqa: ANN201
    from asyncrl.envs.doom import DoomVecEnv

    env = DoomVecEnv(name, n, **kwargs)
    doom.append(env)
    return env


def count_respawns(env) -> SimpleNamespace:  # noqa: ANN001 - DoomVecEnv, imported only with vizdoom
    """Counts the env's respawn_player calls (its games wrapped; close() reaches the engines through them)."""
    counter = SimpleNamespace(count=0)

    class Counted:
        def __init__(self, game) -> None:  # noqa: ANN001 - vizdoom.DoomGame
            self._game = game

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self._game, name)

        def respawn_player(self) -> None:
            counter.count += 1
            self._game.respawn_player()

    env.games = [Counted(g) for g in env.games]
    return counter


@needs_vizdoom
def test_spec_spaces_and_engine_processes(doom: list) -> None:
    spec = make_env_spec("doom_basic")
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions, spec.frameskip) == ((3, 72, 128), np.uint8, 4, 4)
    assert make_env_spec("doom_defend_the_center").num_actions == 6  # {noop, left, right} x {noop, attack}
    assert preset_name("doom_basic") == "doom"
    env = make_vec_env("doom_basic", 2)
    doom.append(env)
    assert env.spec == spec
    assert len(env.engine_pids) == 2 and {p.pid for p in engines()} >= set(env.engine_pids)  # one per game ...
    env.close()
    psutil.wait_procs(engines(), timeout=10)
    assert not engines()  # ... and close() ends them
    with pytest.raises(EnvError, match="did you mean: doom_basic"):
        make_env_spec("doom_basci")


@needs_vizdoom
def test_step_writes_obs_rewards_flags_and_game_variables(doom: list) -> None:
    train, evaluate = make(doom, "doom_basic", 2), make(doom, "doom_basic", 1, training=False)
    buf, eval_buf = Buffers(2), Buffers(1)
    train.reset(0, buf.obs)
    evaluate.reset(0, eval_buf.obs)
    first = buf.obs.copy()
    assert first.std() > 10  # a rendered frame, not a blank one
    np.testing.assert_array_equal(train.game_variables[:, 0], [100, 100])  # HEALTH
    ammo = train.game_variables[:, 2].copy()

    assert buf.step(train, [NOOP, 3]) == []  # env 1 fires
    assert eval_buf.step(evaluate, [NOOP]) == []
    assert not buf.terminated.any() and not buf.truncated.any()
    assert (buf.final_obs == Buffers.SENTINEL).all()  # untouched where nothing was truncated
    assert not np.array_equal(buf.obs[1], first[1])
    # living reward -1 per tic over 4 tics; training scales basic's rewards by 0.01, eval leaves them raw
    assert buf.reward[0] == pytest.approx(-0.04)
    assert eval_buf.reward[0] == -4.0
    buf.step(train, [NOOP, 3])  # the pistol's shot leaves on the second step
    assert train.game_variables[1, 2] == ammo[1] - 1 and train.game_variables[0, 2] == ammo[0]  # SELECTED_WEAPON_AMMO


@needs_vizdoom
def test_timeout_is_a_truncation_with_the_last_frame(doom: list) -> None:
    """A 40-tic limit ends the episode after 10 steps; final_obs is the frame an unlimited twin reaches then."""
    limited, twin = make(doom, "doom_basic", 1, episode_timeout=40), make(doom, "doom_basic", 1, episode_timeout=0)
    buf, twin_buf = Buffers(1), Buffers(1)
    limited.reset(3, buf.obs)
    twin.reset(3, twin_buf.obs)
    for step in range(1, 11):
        stats = buf.step(limited, [NOOP])
        twin_buf.step(twin, [NOOP])
        if step < 10:
            assert stats == [] and not buf.truncated[0] and not buf.terminated[0]
    assert buf.truncated[0] and not buf.terminated[0] and not twin_buf.truncated[0]
    assert [(s.ret, s.length, s.truncated) for s in stats] == [(-40.0, 10, True)]  # raw return: 40 tics x -1
    np.testing.assert_array_equal(buf.final_obs[0], twin_buf.obs[0])
    assert not np.array_equal(buf.obs[0], buf.final_obs[0])  # obs holds the next episode's first frame


@needs_vizdoom
def test_death_is_a_termination(doom: list) -> None:
    """Standing still on health_gathering's acid floor kills the player (living +1/tic, death -100)."""
    env = make(doom, "doom_health_gathering", 1, training=False)
    buf = Buffers(1)
    env.reset(0, buf.obs)
    start_health, health = env.game_variables[0, 0], []
    for _ in range(500):
        stats = buf.step(env, [NOOP])
        assert not buf.truncated[0]
        if buf.terminated[0]:
            break
        health.append(env.game_variables[0, 0])
    assert buf.terminated[0], "the player did not die within 500 steps"
    (episode,) = stats
    assert not episode.truncated and episode.ret == pytest.approx(4 * episode.length - 100, abs=4)
    assert (buf.final_obs == Buffers.SENTINEL).all()
    assert min(health) < 10 and env.game_variables[0, 0] == start_health  # then the next episode's health


@needs_vizdoom
def test_seeds_reproduce_first_observations(doom: list) -> None:
    pair, single = make(doom, "doom_basic", 2), make(doom, "doom_basic", 1)
    a, b = Buffers(2), Buffers(1)
    pair.reset(5, a.obs)
    single.reset(6, b.obs)
    np.testing.assert_array_equal(a.obs[1], b.obs[0])  # env i is seeded with seed + i
    assert not np.array_equal(a.obs[0], a.obs[1])  # and the seed moves the monster
    single.reset(5, b.obs)
    np.testing.assert_array_equal(a.obs[0], b.obs[0])
    for action in (1, 2, 3):
        a.step(pair, [action, action])
        b.step(single, [action])
    np.testing.assert_array_equal(a.obs[0], b.obs[0])


def test_missing_extra_is_a_one_line_error(tmp_path: Path) -> None:
    code = f"{BLOCK_VIZDOOM}; from asyncrl.cli.train import main; sys.exit(main(sys.argv[1:]))"
    args = ["--env", "doom_basic", "--workers", "1", "--seconds", "1", "--train-dir", str(tmp_path)]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "doom_basic" in lines[0] and "pip install -e '.[doom]'" in lines[0]


def test_nature_cnn_takes_the_wide_frames() -> None:
    import torch

    from asyncrl.envs.doom import OBS_SHAPE
    from asyncrl.models.encoders import NatureCNN

    cnn = NatureCNN(*OBS_SHAPE)
    assert cnn(torch.zeros(2, *OBS_SHAPE, dtype=torch.uint8)).shape == (2, 512)
    assert cnn.fc[0].in_features == 64 * 5 * 12  # 72x128 -> 17x31 -> 7x14 -> 5x12


@needs_vizdoom
def test_engines_die_with_their_process() -> None:
    """Engines ignore SIGTERM and outlive their parent; the watchdog kills them when the parent is SIGKILLed."""
    code = ("from asyncrl.envs.doom import DoomVecEnv; import time; "
            "env = DoomVecEnv('doom_basic', 2); print(env.workdir, *env.engine_pids, flush=True); "
            "print(*env.shm_paths, flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        workdir, *words = proc.stdout.readline().split()  # type: ignore[union-attr]
        shm = [Path(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        pids = [int(p) for p in words]
        assert len(pids) == 2 and not any(gone(p) for p in pids) and Path(workdir).is_dir()
        assert len(shm) == 6 and all(p.exists() for p in shm)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in pids), f"engines {pids} outlived their SIGKILLed process"
    while (Path(workdir).exists() or any(p.exists() for p in shm)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(workdir).exists() and not any(p.exists() for p in shm)


@needs_vizdoom
def test_measurements_are_a_second_dict_key(doom: list) -> None:
    """--doom-measurements: {"screen": the frame, "measurements": the game variables}, per key, as a Dict env."""
    from asyncrl.envs.dict_obs import ArrayDict, obs_zeros

    spec = make_env_spec("doom_basic", doom_measurements=True)
    assert [(k.key, k.shape, k.dtype) for k in spec.obs_keys] == [("screen", (3, 72, 128), np.uint8),
                                                                   ("measurements", (5,), np.float32)]
    assert not make_env_spec("doom_basic").is_dict  # off by default
    env = make(doom, "doom_basic", 2, measurements=True)
    obs, final_obs = obs_zeros(spec, 2), obs_zeros(spec, 2)
    assert isinstance(obs, ArrayDict)
    env.reset(0, obs)
    assert obs["screen"].std() > 10 and obs["measurements"][:, 0].tolist() == [100, 100]  # HEALTH
    flags = [np.zeros(2, np.bool_) for _ in range(2)]
    for _ in range(2):
        env.step(np.array([NOOP, 3]), obs, np.zeros(2, np.float32), *flags, final_obs)  # env 1 fires
    np.testing.assert_array_equal(obs["measurements"], env.game_variables)
    assert obs["measurements"][1, 2] == obs["measurements"][0, 2] - 1  # SELECTED_WEAPON_AMMO


@needs_vizdoom
def test_the_hud_shows_what_a_shot_costs(doom: list) -> None:
    """defend_the_center draws the status bar (as Sample Factory's config does): the bottom band of the frame
    differs from the same scenario with `hud=False`, and a spent bullet changes it."""
    from asyncrl.envs.doom import SCENARIOS

    assert SCENARIOS["defend_the_center"].hud and not SCENARIOS["my_way_home"].hud
    with_hud, without = make(doom, "doom_defend_the_center", 1), make(doom, "doom_defend_the_center", 1, hud=False)
    a, b = Buffers(1), Buffers(1)
    with_hud.reset(0, a.obs)
    without.reset(0, b.obs)
    band = slice(62, 72)  # the status bar's rows at 72x128
    assert not np.array_equal(a.obs[0, :, band], b.obs[0, :, band])
    before, ammo = a.obs[0, :, band].copy(), with_hud.game_variables[0, 2]
    for _ in range(3):
        a.step(with_hud, [1])  # attack, no turn
    assert with_hud.game_variables[0, 2] < ammo  # SELECTED_WEAPON_AMMO: a bullet spent
    assert not np.array_equal(a.obs[0, :, band], before)  # the ammo count in the status bar changed


@needs_vizdoom
def test_bot_matches_survive_respawns_after_time_limit_cuts(doom: list) -> None:
    """A death in a bot match is never an episode end, in the first match or in those after a time-limit cut:
    the player respawns and every match runs to the limit (800 tics: 200 steps, one fewer where respawns took
    tics). 2,000 steps of 200-step matches, 2 envs (random play dies 1-4 times in 600 steps); every step leaves
    a rendered frame."""
    env = make(doom, "doom_deathmatch_bots", 2, episode_timeout=800)
    respawns = count_respawns(env)
    buf = Buffers(2)
    env.reset(1, buf.obs)
    rng = np.random.default_rng(1)
    episodes: list[EpisodeStats] = []
    for _ in range(2000):
        buf.obs[:] = 0
        episodes += buf.step(env, rng.integers(0, env.spec.num_actions, 2))
        assert all(rendered(frame) for frame in buf.obs)  # every step leaves a rendered frame
    assert respawns.count >= 1  # deaths happened, and ...
    assert [e for e in episodes if not e.truncated] == []  # ... no match ended at one
    assert len(episodes) >= 18 and all(198 <= e.length <= 200 for e in episodes), [e.length for e in episodes]



@needs_vizdoom
def test_a_duel_is_two_agents_of_one_network_match(doom: list) -> None:
    """doom_duel: 4 env columns are 2 matches of 2 players, a process each, at ports of their own. Every 100 steps
    (400 tics) every column's window is cut at the same step, a truncation whose last frame is also the next
    window's first; nothing terminates; a window's return is its frags minus its deaths; the players run 4 tics a
    step or more (the asynchronous clock). close() leaves no player, engine or shared memory behind."""
    import re

    from asyncrl.envs.doom_match import DoomMatchVecEnv

    env = DoomMatchVecEnv("doom_duel", 4, episode_timeout=400)
    doom.append(env)
    assert env.spec.num_agents == 2 and env.spec.num_actions == 3 * 3 * 3 * 2  # turn, move, strafe, attack
    ports = [int(re.search(r"-port (\d+)", p.proc.args[-1]).group(1)) for p in env.players]
    assert ports[0] == ports[1] != ports[2] == ports[3]
    players = [p.proc.pid for p in env.players]
    buf = Buffers(4)
    env.reset(3, buf.obs)
    rng = np.random.default_rng(3)
    windows: list[EpisodeStats] = []
    for step in range(1, 251):
        episodes = buf.step(env, rng.integers(0, env.spec.num_actions, 4))
        assert not buf.terminated.any() and buf.obs.std() > 10
        if step % 100:
            assert episodes == [] and not buf.truncated.any()
            continue
        assert sorted(e.env for e in episodes) == [0, 1, 2, 3] and buf.truncated.all()
        assert all(e.truncated and e.length == 100 for e in episodes)
        assert np.array_equal(buf.final_obs, buf.obs)
        windows += episodes
    assert all(e.ret == e.extra["frags"] - e.extra["deaths"] and e.extra["tics_per_step"] >= 4 for e in windows)
    assert sum(e.extra["deaths"] for e in windows) >= 1, windows  # random play dies (mostly by its own hand)
    env.close()
    assert all(gone(pid) for pid in players)



@needs_vizdoom
def test_a_duels_players_and_engines_die_with_their_process() -> None:
    """A SIGKILLed process that held a duel leaves nothing behind: its players see their sockets close and exit,
    and their engines' watchdogs kill the engines."""
    code = ("from asyncrl.envs.doom_match import DoomMatchVecEnv; import time, psutil; "
            "env = DoomMatchVecEnv('doom_duel', 2); "
            "print(*[p.pid for p in psutil.Process().children(recursive=True)], flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        names = [psutil.Process(p).name() for p in pids]
        assert names.count("vizdoom") == 2 and not any(gone(p) for p in pids), names
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in pids), [p for p in pids if not gone(p)]


@needs_vizdoom
def test_a_duel_on_a_taken_port_starts_again_at_another(doom: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port that another process takes between the pick and the host's bind does not stop the run: the match
    starts again at a new port."""
    import socket

    import asyncrl.envs.doom_match as doom_match

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("0.0.0.0", 0))
        picks = [taken.getsockname()[1]]
        real, real_workdir, made = doom_match.free_port, doom_match.make_workdir, []
        monkeypatch.setattr(doom_match, "free_port", lambda: picks.pop() if picks else real())
        monkeypatch.setattr(doom_match, "make_workdir", lambda: made.append(real_workdir()) or made[-1])
        env = doom_match.DoomMatchVecEnv("doom_duel", 2)
        doom.append(env)
        assert not picks and f"-port {taken.getsockname()[1]} " not in env.players[0].proc.args[-1]
        # the first match's players were killed while connecting, before their watchdogs: their dirs are gone too
        assert [Path(d).exists() for d in made] == [False, False, True, True], made
        buf = Buffers(2)
        env.reset(0, buf.obs)
        buf.step(env, [0, 0])
        assert buf.obs.std() > 10
