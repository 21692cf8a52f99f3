"""VizDoom network matches (`doom_duel`): every player a process of its own, every player an agent (env column).

Each player is a child process (`python -m asyncrl.envs.doom_match`) holding a one-game `DoomVecEnv` that
hosts or joins the match on the loopback interface, at a port the operating system gave out as free.
`DoomMatchVecEnv.step` sends every player its action, then reads every reply, so the players of all matches step
at once.

VizDoom's synchronous mode stalls a network game stepped this way: a player that has finished its tics and waits
for its next action sends nothing, while another still needs its commands for a tic it has run ahead to (one
stall within 1-100 steps here, at 4 tics a step or at 1). So the players run in the asynchronous mode on a clock
of MATCH_TICRATE tics per second (asyncrl/envs/doom.py): an agent step is `make_action(a, 4)`, plus the tics
that pass while the player waits for its next action (the action held). A match is never restarted (a restart of
a network game stalls as well): its episodes are windows of `episode_timeout` tics / 4 agent steps, counted here
and cut at the same step for every player, a truncation whose last frame is also the next window's first.

Only small messages cross the socket pair between the env and a player: an action down; a reward, two flags, the
72x128 frame (27 KB) and a finished episode's stats up. A player exits when its socket closes (the rollout
worker is gone) and ignores Ctrl-C (the run stops it with `close`); its engine has `DoomVecEnv`'s watchdog.
"""

from __future__ import annotations

import ast
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from asyncrl.envs.base import EnvError, EpisodeStats, VecEnv
from asyncrl.envs.doom import (
    DEATHMATCH_ARGS,
    FRAMESKIP,
    GAME_VARIABLES,
    MEASUREMENTS_KEY,
    OBS_SHAPE,
    SCREEN_KEY,
    SHM_NAMES,
    _instance_id,
    doom_env_spec,
    make_workdir,
    remove_orphans,
    scenario,
    shm_entries,
)

READY_TIMEOUT = 60.0  # seconds for every player of a match to start its engine and connect
START_TRIES = 3  # a match whose players fail to start is started again at a new port, up to this many times
CLOSE_TIMEOUT = 10.0  # seconds a player has to close its engine before it is killed


def free_port() -> int:
    """A UDP port on the loopback interface that nothing holds now (the kernel's pick, so parallel runs differ)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def player_args(player: int, players: int, port: int) -> str:
    """The engine arguments of player `player` (0 hosts) of a `players`-player match at `port`."""
    if player == 0:
        return f"-host {players} -port {port} {DEATHMATCH_ARGS} +name player0"
    return f"-join 127.0.0.1 -port {port} +name player{player}"


class Player:
    """One player process and its end of the socket pair."""

    def __init__(self, name: str, player: int, players: int, port: int, *, training: bool) -> None:
        mine, theirs = socket.socketpair()
        # made here, so that a player killed while its engine connects (no watchdog yet) leaves nothing behind
        self.workdir = make_workdir()
        settings = repr((name, player_args(player, players, port), training, self.workdir))
        # the engines print their network handshake: out of sight; a player's errors come back over the socket
        self.proc = subprocess.Popen([sys.executable, "-m", "asyncrl.envs.doom_match", str(theirs.fileno()),
                                      settings], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())

    def request(self, message: tuple) -> None:
        self.conn.send(message)

    def reply(self, timeout: float | None = None) -> Any:
        if timeout is not None and not self.conn.poll(timeout):
            raise EnvError(f"a VizDoom match player (pid {self.proc.pid}) did not answer within {timeout:.0f} s")
        try:
            answer = self.conn.recv()
        except EOFError:
            raise EnvError(f"a VizDoom match player (pid {self.proc.pid}) exited with code {self.proc.wait()} "
                           f"without a word") from None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def kill(self) -> None:
        """Stop it now, with its engine (a player still connecting reads no socket and has no watchdog yet)."""
        try:
            engines = [p for p in psutil.Process(self.proc.pid).children() if p.name() == "vizdoom"]
            instances = [_instance_id(p) for p in engines]
        except (psutil.Error, RuntimeError, ValueError, IndexError):
            engines, instances = [], []
        self.proc.kill()
        self.proc.wait()
        for engine in engines:
            try:
                engine.kill()
            except psutil.Error:
                pass
        for instance in instances:
            for prefix in SHM_NAMES:
                Path(f"/dev/shm/{prefix}{instance}").unlink(missing_ok=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(("close",))
        except OSError:  # already gone
            pass
        try:
            self.proc.wait(CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # its engine's watchdog sees the pipe close and kills the engine
            self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.conn.close()


class DoomMatchVecEnv(VecEnv):
    """`ceil(num_envs / players)` matches of a network scenario; agent k of match i is env column
    `i * players + k`."""

    def __init__(self, name: str, num_envs: int, *, training: bool = True, episode_timeout: int | None = None,
                 measurements: bool = False) -> None:
        self.scenario = scenario(name)
        self.num_agents = self.scenario.players
        self.spec = doom_env_spec(name, measurements)
        self.num_envs = num_envs = math.ceil(num_envs / self.num_agents) * self.num_agents  # whole matches
        self.measurements = measurements
        self.players: list[Player] = []
        timeout = self.scenario.timeout if episode_timeout is None else episode_timeout
        self.episode_steps = int(timeout or 0) // FRAMESKIP  # a match's length in agent steps; 0: no limit
        self._steps = np.zeros(num_envs // self.num_agents, dtype=np.int64)  # agent steps of each match's episode
        self.game_variables = np.zeros((num_envs, len(GAME_VARIABLES)), dtype=np.float32)
        matches: list[list[Player]] = []
        before = shm_entries()
        try:
            matches = [self._start(name, training) for _ in range(num_envs // self.num_agents)]
            deadline = time.monotonic() + READY_TIMEOUT
            for i in range(len(matches)):
                for attempt in range(START_TRIES):
                    try:  # "ready": every engine of the match has joined it
                        for player in matches[i]:
                            player.reply(max(deadline - time.monotonic(), 0.0))
                        break
                    except EnvError:  # e.g. another process took the port in between: a new one
                        for player in matches[i]:
                            player.kill()
                        remove_orphans(shm_entries() - before)
                        if attempt == START_TRIES - 1:
                            raise
                        matches[i] = self._start(name, training)
                        deadline = time.monotonic() + READY_TIMEOUT
        except BaseException:
            for match in matches:
                for player in match:
                    player.kill()
            remove_orphans(shm_entries() - before)
            raise
        self.players = [player for match in matches for player in match]

    def _start(self, name: str, training: bool) -> list[Player]:
        """The player processes of one match, at a port of its own (they report "ready" once connected)."""
        port = free_port()
        return [Player(name, k, self.num_agents, port, training=training) for k in range(self.num_agents)]

    def reset(self, seed: int, obs_out: Any) -> None:
        for c, player in enumerate(self.players):
            player.request(("reset", int(seed) + c))
        for c, player in enumerate(self.players):
            self._write(c, player.reply(), obs_out)
        self._steps[:] = 0

    def step(self, actions: np.ndarray, obs_out: Any, reward_out: np.ndarray, terminated_out: np.ndarray,
             truncated_out: np.ndarray, final_obs_out: Any) -> list[EpisodeStats]:
        self._steps += 1
        cut = (self._steps >= self.episode_steps) if self.episode_steps else np.zeros_like(self._steps, dtype=bool)
        for c, player in enumerate(self.players):
            player.request(("step", int(actions[c]), bool(cut[c // self.num_agents])))
        stats: list[EpisodeStats] = []
        for c, player in enumerate(self.players):
            reward, terminated, truncated, obs, final, episode = player.reply()
            if terminated or truncated:
                self._steps[c // self.num_agents] = 0
            reward_out[c], terminated_out[c], truncated_out[c] = reward, terminated, truncated
            self._write(c, obs, obs_out)
            if final is not None:
                self._write(c, final, final_obs_out, variables=False)
            if episode is not None:
                episode.env = c
                stats.append(episode)
        return stats

    def _write(self, c: int, obs: tuple[np.ndarray, np.ndarray], out: Any, variables: bool = True) -> None:
        """A player's (frame, game variables) into row c of `out` (a Dict observation's two keys with measurements)."""
        frame, game_variables = obs
        if self.measurements:
            out[SCREEN_KEY][c] = frame
            out[MEASUREMENTS_KEY][c] = game_variables
        else:
            out[c] = frame
        if variables:
            self.game_variables[c] = game_variables

    def close(self) -> None:
        for player in self.players:
            player.close()
        self.players = []


def serve(conn: Connection, name: str, game_args: str, training: bool, workdir: str) -> None:
    """A player's loop: make its game (which joins the match), then answer reset / step / close requests. A step
    request's third item ends the episode at that step (the match's time limit)."""
    from asyncrl.envs.doom import DoomVecEnv

    try:
        env = DoomVecEnv(name, 1, training=training, episode_timeout=0, game_args=game_args, workdir=workdir)
    except BaseException as error:
        conn.send(EnvError(f"{name}: a match player could not start: {error}"))
        return
    try:
        _answer(conn, env)
    except BaseException as error:  # the env's process raises it (a player has no console)
        try:
            conn.send(EnvError(f"{name}: a match player failed: {type(error).__name__}: {error}"))
        except OSError:  # the env's process is gone
            pass
    finally:
        env.close()


def _answer(conn: Connection, env: Any) -> None:
    """Answer requests until `close` or the env's end of the socket closes."""
    obs, final = np.zeros((1, *OBS_SHAPE), np.uint8), np.zeros((1, *OBS_SHAPE), np.uint8)
    reward, terminated, truncated = np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool)
    action = np.zeros(1, np.int64)
    conn.send("ready")
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the env's process is gone
            return
        if request[0] == "close":
            return
        if request[0] == "reset":
            env.reset(request[1], obs)
            conn.send((obs[0], env.game_variables[0].copy()))
            continue
        action[0] = request[1]
        episodes = env.step(action, obs, reward, terminated, truncated, final)
        if request[2] and not terminated[0]:
            episodes, truncated[0] = [env.cut(0, obs, final)], True
        last = (final[0], env.final_game_variables[0].copy()) if truncated[0] else None
        conn.send((float(reward[0]), bool(terminated[0]), bool(truncated[0]),
                   (obs[0], env.game_variables[0].copy()), last, episodes[0] if episodes else None))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the run closes us
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)  # the engine this process starts must not hold the socket
    serve(Connection(fd), *ast.literal_eval(sys.argv[2]))


if __name__ == "__main__":
    main()
