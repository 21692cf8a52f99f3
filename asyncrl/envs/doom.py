"""VizDoom scenarios (`doom_<scenario>`), stepped one after another in this process.

Each env is one `vizdoom.DoomGame` (an engine child process driven over shared memory). Frames are rendered at
256x144 (16:9, the wide field of view) in channels-first RGB and averaged 2x2 down to 3x72x128 uint8. The
status bar (HUD) is drawn only where the scenario rations something the view does not show (defend_the_center's
ammunition): drawing it costs 5-12% more CPU per step (`benchmarks/bench_doom.py --hud both`). One agent step is
`make_action(action, 4)`: four emulator tics with the action held, so `EnvSpec.frameskip = 4` and frame counts
are tics. Actions are a Discrete set of button combinations per scenario (`SCENARIOS`).

Episode ends follow the terminated/truncated split of the step signature
`step(actions, obs_out, reward_out, terminated_out, truncated_out, final_obs_out)`: the scenario's
`episode_timeout` is enforced here (VizDoom's own is switched off, since a finished VizDoom episode has no
state left to read), so a timeout is a truncation whose last frame goes to `final_obs_out`; death or the
scenario's own end (the monster killed in basic, the vest reached in my_way_home) is a termination. In the bot
deathmatch and the duel a death is not an episode end: the player respawns and the match runs to the timeout.

The duel (`doom_duel`) is a network game of two players, each an agent (an env column): its games are stepped
by `asyncrl/envs/doom_match.py`, a process per player, each holding a one-game `DoomVecEnv` made with
`game_args` that host or join the match. Network games run in VizDoom's asynchronous mode at MATCH_TICRATE (its
synchronous mode stalls a network game whose players wait between steps), and a match is never restarted: its
episodes are windows of it that the players' env cuts (`cut`).

vizdoom is an optional extra and is imported only when a Doom env is made.
"""

from __future__ import annotations

import difflib
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from asyncrl.envs.base import EnvError, EnvSpec, EpisodeStats, EpisodeTracker, ObsKey, VecEnv
from asyncrl.system import install_hint

DOOM_PREFIX = "doom_"
FRAMESKIP = 4
HEIGHT, WIDTH = 72, 128  # rendered at twice this (RES_256X144) and averaged 2x2
RENDER_RESOLUTION = "RES_256X144"
OBS_SHAPE = (3, HEIGHT, WIDTH)
# The vector observation every scenario exposes (`DoomVecEnv.game_variables`), in this order.
GAME_VARIABLES = ("HEALTH", "ARMOR", "SELECTED_WEAPON_AMMO", "KILLCOUNT", "FRAGCOUNT")
FRAGS = GAME_VARIABLES.index("FRAGCOUNT")
SCREEN_KEY, MEASUREMENTS_KEY = "screen", "measurements"  # the Dict observation's keys (--doom-measurements)
INSTALL_HINT = install_hint("doom")
# Engines outlive their controlling process and ignore SIGTERM. A shell holding the read end of a pipe from
# this process SIGKILLs them when the pipe closes, i.e. when this process dies without close() (even by
# SIGKILL), then removes their directory and the shared memory and message queues close() would have removed.
# Arguments: the directory, the /dev/shm paths (one word, space-separated), then the engine pids.
WATCHDOG = 'read _; dir=$1; shm=$2; shift 2; kill -9 "$@"; rm -rf "$dir" $shm'
SHM_NAMES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")  # + the engine's instance id, in /dev/shm
DEATHMATCH_ARGS = (
    "-deathmatch +sv_forcerespawn 1 +sv_noautoaim 1 +sv_respawnprotect 1 +sv_spawnfarthest 1 "
    "+sv_nocrouch 1 +viz_respawn_delay 0 +viz_nocheat 1"
)
BOT_GAME_ARGS = "-host 1 " + DEATHMATCH_ARGS
# Tics per second of a network match (5x real time; ASYNCRL_DOOM_TICRATE sets another). The engines run on their own
# clock, so an agent step is 4 tics plus those that pass while its players wait for their next action: in the
# preset's layout on 2 cores 9.1 tics at 175 (1,227 frames/s), 8.1 at 105 (849), 30.6 at 1,050 (740).
MATCH_TICRATE = int(os.environ.get("ASYNCRL_DOOM_TICRATE", "175"))

Option = tuple[str, ...]  # buttons held together; () is no-op
Group = tuple[Option, ...]  # mutually exclusive choices; an action picks one option from every group

NOOP: Option = ()
TURN: Group = (NOOP, ("TURN_LEFT",), ("TURN_RIGHT",))
ATTACK: Group = (NOOP, ("ATTACK",))
FORWARD: Group = (NOOP, ("MOVE_FORWARD",))
FORWARD_BACK: Group = (NOOP, ("MOVE_FORWARD",), ("MOVE_BACKWARD",))
STRAFE: Group = (NOOP, ("MOVE_LEFT",), ("MOVE_RIGHT",))


@dataclass(frozen=True)
class DoomScenario:
    """One `doom_<name>` env: a config shipped with vizdoom, its action set and its training reward scale."""

    config: str  # file in vizdoom.scenarios_path
    groups: tuple[Group, ...]  # the Discrete actions are the product of these groups, in order
    reward_scale: float = 1.0  # training reward = raw reward x scale (episode stats stay raw)
    timeout: int | None = None  # episode limit in tics; None: the config's episode_timeout (0: none)
    bots: int = 0  # deathmatch bots added at every episode start (multiplayer host)
    players: int = 1  # players in one network game, each an agent of the env (a process each: doom_match.py)
    hud: bool = False  # draw the status bar (ammo, health, armour) across the bottom of the frame

    @property
    def respawns(self) -> bool:
        """A death is not an episode end: the player respawns and the match runs to its time limit."""
        return self.bots > 0 or self.players > 1

    @property
    def actions(self) -> list[Option]:
        return [tuple(b for option in combo for b in option) for combo in itertools.product(*self.groups)]

    @property
    def buttons(self) -> list[str]:
        return list(dict.fromkeys(b for group in self.groups for option in group for b in option))


SCENARIOS: dict[str, DoomScenario] = {
    # noop, left, right, attack (single buttons, as in Sample Factory); living reward -1/tic, kill +100
    "basic": DoomScenario("basic.cfg", ((NOOP, ("MOVE_LEFT",), ("MOVE_RIGHT",), ("ATTACK",)),), 0.01),
    # 26 rounds and no pick-ups: the status bar's ammo count is what lets the value function price a missed shot
    "defend_the_center": DoomScenario("defend_the_center.cfg", (TURN, ATTACK), hud=True),
    "defend_the_line": DoomScenario("defend_the_line.cfg", (TURN, ATTACK)),
    "health_gathering": DoomScenario("health_gathering.cfg", (TURN, FORWARD), 0.01),
    "health_gathering_supreme": DoomScenario("health_gathering_supreme.cfg", (TURN, FORWARD), 0.01),
    "my_way_home": DoomScenario("my_way_home.cfg", (TURN, (NOOP, ("MOVE_FORWARD",), ("MOVE_LEFT",), ("MOVE_RIGHT",)))),
    "deadly_corridor": DoomScenario("deadly_corridor.cfg", (TURN, FORWARD_BACK, STRAFE, ATTACK), 0.01),
    "take_cover": DoomScenario("take_cover.cfg", (STRAFE,), 0.01),
    # an arena against spawning monsters (single player), reward per kill by monster difficulty
    "deathmatch": DoomScenario("deathmatch.cfg", (TURN, FORWARD_BACK, STRAFE, ATTACK)),
    # a deathmatch against 7 bots on multi_deathmatch.wad: +1 per frag, -1 per death, respawn, 2-minute matches
    "deathmatch_bots": DoomScenario("multi.cfg", (TURN, FORWARD_BACK, STRAFE, ATTACK), timeout=4200, bots=7),
    # two agents in one network game on multi_duel.wad: +1 per frag, -1 per death, respawn, 2-minute matches
    "duel": DoomScenario("multi_duel.cfg", (TURN, FORWARD_BACK, STRAFE, ATTACK), timeout=4200, players=2),
}

def scenario(name: str) -> DoomScenario:
    """The scenario for env name `doom_<scenario>`; EnvError for an unknown one."""
    key = name[len(DOOM_PREFIX) :] if name.startswith(DOOM_PREFIX) else name
    if key in SCENARIOS:
        return SCENARIOS[key]
    names = [DOOM_PREFIX + s for s in SCENARIOS]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f"did you mean: {', '.join(close)}? " if close else ""
    raise EnvError(f"unknown Doom scenario {name!r}; {hint}Doom envs: {', '.join(names)}")


def import_vizdoom(name: str) -> Any:
    """The vizdoom module, or a one-line EnvError saying how to install the extra."""
    try:
        import vizdoom
    except ImportError:
        raise EnvError(f"env {name!r} needs VizDoom: {INSTALL_HINT}") from None
    return vizdoom


def doom_env_spec(name: str, measurements: bool = False) -> EnvSpec:
    """Describe `doom_<scenario>` without starting a game (vizdoom must still be installed); with `measurements`,
    a Dict observation {"screen": the frame, "measurements": GAME_VARIABLES as float32}."""
    sc = scenario(name)
    import_vizdoom(name)
    actions = gym.spaces.Discrete(len(sc.actions))
    if measurements:
        keys = (ObsKey(SCREEN_KEY, OBS_SHAPE, np.dtype(np.uint8)),
                ObsKey(MEASUREMENTS_KEY, (len(GAME_VARIABLES),), np.dtype(np.float32)))
        return EnvSpec(name, (), np.dtype(np.float32), actions, frameskip=FRAMESKIP, obs_keys=keys,
                       num_agents=sc.players)
    return EnvSpec(name, OBS_SHAPE, np.dtype(np.uint8), actions, frameskip=FRAMESKIP, num_agents=sc.players)


def make_workdir() -> str:
    """A new working directory for VizDoom engines under the temp dir."""
    return tempfile.mkdtemp(prefix="asyncrl-vizdoom-")


def _instance_id(engine: psutil.Process) -> str:
    args = engine.cmdline()
    instance = args[args.index("+viz_instance_id") + 1]
    if not instance.isalnum():
        raise RuntimeError(f"unexpected VizDoom instance id {instance!r}")
    return instance


def shm_entries() -> set[str]:
    """The VizDoom entries in /dev/shm now."""
    return {p.name for p in Path("/dev/shm").glob("ViZDoom*")}


def remove_orphans(names: set[str]) -> None:
    """Remove the /dev/shm entries in `names` that no live process maps: those of a game whose process crashed
    (a match host that could not bind its port dies by SIGSEGV); a game starting beside it maps its own as it
    creates them."""
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        mapped |= {name for name in names if f"/dev/shm/{name}" in text}
    for name in names - mapped:
        Path("/dev/shm", name).unlink(missing_ok=True)


@contextmanager
def _cwd(path: str) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


class DoomVecEnv(VecEnv):
    """`num_envs` games of one scenario.

    Training mode: `reward_out` is the raw reward times the scenario's `reward_scale`; eval mode: raw. Episode
    stats always carry the raw return. `game_variables[i]` holds GAME_VARIABLES for the observation now in
    `obs_out[i]`; `final_game_variables[i]` those of `final_obs_out[i]` where a step truncated env i. With
    `measurements` the observations are Dict ones (`ArrayDict`s): the frame in "screen" and the game variables
    in "measurements" as well. `hud` draws the status bar or not (None: as the scenario does). `game_args` are
    added to every game's engine arguments (a network game's `-host` / `-join`: asyncrl/envs/doom_match.py).
    """

    def __init__(self, name: str, num_envs: int, *, training: bool = True, episode_timeout: int | None = None,
                 measurements: bool = False, hud: bool | None = None, game_args: str = "",
                 workdir: str | None = None) -> None:
        """`workdir`: the engines' working directory, removed by `close` (default: a new one under the temp dir);
        a caller that may kill this process before its watchdog starts makes it, to remove it then."""
        self.num_envs = num_envs
        self.training = training
        self.measurements = measurements
        self.scenario = scenario(name)
        self.hud = self.scenario.hud if hud is None else hud
        self._vzd = import_vizdoom(name)
        self.spec = doom_env_spec(name, measurements)
        buttons = self.scenario.buttons
        table = np.zeros((len(self.scenario.actions), len(buttons)), dtype=np.float64)
        for a, option in enumerate(self.scenario.actions):
            for b in option:
                table[a, buttons.index(b)] = 1.0
        self._action_table = [row.tolist() for row in table]
        self._scale = self.scenario.reward_scale if training else 1.0
        self._game_args = game_args
        self.games: list[Any] = []
        self.engine_pids: list[int] = []  # the engine processes, children of this process
        self.shm_paths: list[str] = []  # their shared memory and message queues
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.workdir = workdir or make_workdir()  # the engines' cwd (they create _vizdoom/)
        try:
            me = psutil.Process()
            before = {p.pid for p in me.children()}
            for _ in range(num_envs):
                self.games.append(self._make_game(buttons))
            engines = [p for p in me.children() if p.pid not in before and p.name() == "vizdoom"]
            self.engine_pids = [p.pid for p in engines]
            self.shm_paths = [f"/dev/shm/{prefix}{_instance_id(p)}" for p in engines for prefix in SHM_NAMES]
            command = ["sh", "-c", WATCHDOG, "asyncrl-doom-watchdog", self.workdir, " ".join(self.shm_paths),
                       *map(str, self.engine_pids)]
            self._watchdog = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            self.close()
            raise
        first = self.games[0]
        timeout = self.scenario.timeout if self.scenario.timeout is not None else self._config_timeout
        self.episode_timeout = int(episode_timeout if episode_timeout is not None else timeout)  # tics, 0: none
        self._start_time = int(first.get_episode_start_time())
        self.game_variables = np.zeros((num_envs, len(GAME_VARIABLES)), dtype=np.float32)
        self.final_game_variables = np.zeros_like(self.game_variables)
        self.episodes = EpisodeTracker(num_envs)
        self._frags = np.zeros(num_envs, dtype=np.float64)  # a network match's FRAGCOUNT where the window began
        self._score = np.zeros(num_envs, dtype=np.float64)  # a network match's frags - deaths at the last step
        self._tic = np.zeros(num_envs, dtype=np.int64)  # a network match's episode time where the window began

    def _make_game(self, buttons: list[str]) -> Any:
        vzd = self._vzd
        game = vzd.DoomGame()
        try:
            game.load_config(os.path.join(vzd.scenarios_path, self.scenario.config))
            game.set_doom_config_path(os.devnull)  # no _vizdoom.ini read or written
            self._config_timeout = int(game.get_episode_timeout())
            game.set_episode_timeout(0)  # enforced in step() so that a truncated episode still has a last frame
            if self.scenario.players > 1:
                game.set_mode(vzd.Mode.ASYNC_PLAYER)
                game.set_ticrate(MATCH_TICRATE)
            else:
                game.set_mode(vzd.Mode.PLAYER)
            game.set_window_visible(False)
            game.set_sound_enabled(False)
            game.set_screen_resolution(getattr(vzd.ScreenResolution, RENDER_RESOLUTION))
            game.set_screen_format(vzd.ScreenFormat.CRCGCB)  # channels first
            game.set_render_hud(self.hud)
            game.set_render_crosshair(False)
            game.set_render_messages(False)
            game.set_render_decals(False)
            game.set_render_particles(False)
            game.set_available_buttons([getattr(vzd.Button, b) for b in buttons])
            game.set_available_game_variables([getattr(vzd.GameVariable, v) for v in GAME_VARIABLES])
            if self.scenario.bots:
                game.add_game_args(BOT_GAME_ARGS)
            if self._game_args:
                game.add_game_args(self._game_args)
            if self.scenario.bots:
                game.set_frag_reward(1.0)
            with _cwd(self.workdir):  # the engine process starts in init() and inherits the cwd
                game.init()
        except BaseException:
            game.close()
            raise
        return game

    def reset(self, seed: int, obs_out: np.ndarray) -> None:
        for i, game in enumerate(self.games):
            game.set_seed((int(seed) + i) % 2**32)
            if self.scenario.players == 1:  # a network match is never restarted (`cut`)
                self._new_episode(game)
            self._read_state(i, obs_out, self.game_variables)
        self._frags[:] = self.game_variables[:, FRAGS]
        if self.scenario.players > 1:
            for i, game in enumerate(self.games):
                self._match_reward(i)  # the score so far: the next step's reward starts from it
                self._tic[i] = game.get_episode_time()
        self.episodes.drop()

    def step(
        self,
        actions: np.ndarray,
        obs_out: np.ndarray,
        reward_out: np.ndarray,
        terminated_out: np.ndarray,
        truncated_out: np.ndarray,
        final_obs_out: np.ndarray,
    ) -> list[EpisodeStats]:
        """Step every game once (4 tics); write next obs, training rewards, end flags; return finished episodes.

        Where env i was truncated, `final_obs_out[i]` gets the episode's last frame and `obs_out[i]` the next
        episode's first; other rows of `final_obs_out` are left alone.
        """
        stats: list[EpisodeStats] = []
        timeout = self.episode_timeout
        for i, game in enumerate(self.games):
            reward = game.make_action(self._action_table[int(actions[i])], FRAMESKIP)
            if self.scenario.players > 1:  # asynchronous: the reward of the tics between steps is not in `reward`
                reward = self._match_reward(i)
            self.episodes.add(reward, i)
            reward_out[i] = reward * self._scale
            terminated = game.is_episode_finished()  # death or the scenario's end: VizDoom's timeout is off
            truncated = not terminated and timeout > 0 and game.get_episode_time() - self._start_time >= timeout
            # A bot match goes on after a death: respawn, unless the time limit cut the match at this step (a new
            # one starts anyway, and a respawn can end the match, which would book the cut as a termination). In a
            # network match the engine respawns the player (+sv_forcerespawn): respawn_player() would run tics
            # that the other players, waiting for their next step, never send.
            if not terminated and not truncated and self.scenario.bots and game.is_player_dead():
                game.respawn_player()
                terminated = game.is_episode_finished()  # the engine can end the match at a respawn
            terminated_out[i] = terminated
            truncated_out[i] = truncated
            if terminated or truncated:
                stats.append(self._end_episode(i, truncated, final_obs_out))
            self._read_state(i, obs_out, self.game_variables)
        return stats

    def cut(self, i: int, obs_out: Any, final_obs_out: Any) -> EpisodeStats:
        """End env i's episode now as a truncation, the match going on: a window of a network match, which its
        players' env counts in agent steps. The frame reached is both `final_obs_out[i]` and `obs_out[i]`. The
        stats carry the window's frags (a kill +1, a suicide -1), deaths (the return is frags - deaths) and the
        tics per agent step (4, plus those that passed while the player waited for its next action)."""
        self._read_state(i, final_obs_out, self.final_game_variables)
        frags = float(self.final_game_variables[i, FRAGS] - self._frags[i])
        self._frags[i] = self.final_game_variables[i, FRAGS]
        tic = int(self.games[i].get_episode_time())
        tics, self._tic[i] = tic - self._tic[i], tic
        extra = {"frags": frags, "deaths": frags - float(self.episodes.returns[i]),
                 "tics_per_step": round(float(tics) / max(int(self.episodes.lengths[i]), 1), 2)}
        stats = self.episodes.end(i, truncated=True, extra=extra)
        self._read_state(i, obs_out, self.game_variables)
        return stats

    def _match_reward(self, i: int) -> float:
        """A network match's reward since the last step: +1 a frag (-1 a suicide), -1 a death."""
        game, variable = self.games[i], self._vzd.GameVariable
        score = game.get_game_variable(variable.FRAGCOUNT) - game.get_game_variable(variable.DEATHCOUNT)
        reward, self._score[i] = score - self._score[i], score
        return float(reward)

    def _end_episode(self, i: int, truncated: bool, final_obs_out: Any) -> EpisodeStats:
        if truncated:
            self._read_state(i, final_obs_out, self.final_game_variables)
        stats = self.episodes.end(i, truncated)
        self._new_episode(self.games[i])
        return stats

    def close(self) -> None:
        if self._watchdog is not None:  # stopped first: it must not signal pids that close() has freed
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog.stdin.close()  # type: ignore[union-attr]
            self._watchdog = None
        for game in self.games:
            game.close()  # stops the engine process
        self.games = []
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _new_episode(self, game: Any) -> None:
        if self.scenario.bots:
            # The host's new_episode ends a running match, and a match started by that same call ends at the
            # player's first death (is_episode_finished turns true at the respawn): end a cut match first, so
            # that the next one starts from a finished game like a match the engine ended itself.
            if not game.is_episode_finished():
                game.new_episode()
            # before new_episode: bots added after it end the episode within a few tics
            game.send_game_command("removebots")
            for _ in range(self.scenario.bots):
                game.send_game_command("addbot")
        game.new_episode()

    def _read_state(self, i: int, obs: Any, variables: np.ndarray) -> None:
        """The frame into obs[i] (obs["screen"][i] and, from `variables[i]`, obs["measurements"][i] with
        measurements), the game variables into variables[i]."""
        state = self.games[i].get_state()
        frames = obs[SCREEN_KEY] if self.measurements else obs
        rows = state.screen_buffer.reshape(3, HEIGHT, 2, 2 * WIDTH).astype(np.uint16)
        pairs = (rows[:, :, 0] + rows[:, :, 1]).reshape(3, HEIGHT, WIDTH, 2)  # two rows summed, then two columns
        frames[i] = (pairs[..., 0] + pairs[..., 1] + 2) >> 2  # 2x2 average, rounded (sum(axis=...) is 20x slower)
        variables[i] = state.game_variables
        if self.measurements:
            obs[MEASUREMENTS_KEY][i] = variables[i]
