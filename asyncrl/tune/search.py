"""The tuner's search: measure the start layout, then the moves its verdict calls for, best layout first.

Each step takes the fastest layout measured so far and tries the first of its verdict's moves
(asyncrl.diagnostics.layout_moves) not yet measured; when its moves are used up, the next fastest layout's (none
under half the best's steps/s); when every such layout's are, the best layout's other moves. A move that cost a
layout more than half its steps/s is not tried on another. It stops when the next measurement would not end inside
the time budget. With `confirm`, the start and the winner are measured once more at the end and the better of the
two by their mean steps/s wins (one lucky or unlucky run on a busy machine does not decide alone; the ratio is of
those means). Torch-free.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.config import Config
from asyncrl.diagnostics.bottleneck import KINDS, LABELS
from asyncrl.diagnostics.layout_moves import Move, Reference, layout_of, moves
from asyncrl.tune.measure import Measurement

START_UP_S = 4.0  # a measurement's wall time past its --seconds before the first one says (start-up, shutdown)
BACKFIRED = 0.5  # a move that left less than this share of its layout's steps/s is not tried on other layouts


@dataclass
class Trial:
    """One measured layout: its number, settings, why it was tried and what it showed (a layout measured again
    keeps its number and adds to `results`)."""

    number: int
    config: Config
    why: str
    results: list[Measurement] = field(default_factory=list)
    parent: Trial | None = None  # the layout it was a move from, and the move
    move: Move | None = None

    @property
    def layout(self) -> dict[str, int]:
        return layout_of(self.config)

    @property
    def result(self) -> Measurement:
        return self.results[0]

    @property
    def ok(self) -> bool:
        return not self.result.error

    @property
    def score(self) -> float:
        """Mean trained-on steps/s over its measurements."""
        return statistics.fmean(r.score for r in self.results)


def key(cfg: Config) -> tuple[int, ...]:
    return tuple(layout_of(cfg).values())


@dataclass
class Search:
    """The search state; `measure(config, name)` runs one layout (asyncrl.tune.measure.measure, or a stand-in)."""

    start: Config
    reference: Reference
    cores: int
    seconds: float
    budget: float
    measure: Callable[[Config, str], Measurement]
    max_layouts: int = 0  # 0: as many as the budget allows
    confirm: bool = True
    on_trial: Callable[[Trial], None] = lambda trial: None
    trials: list[Trial] = field(default_factory=list)
    confirmed: bool = False
    final: Trial | None = None  # the winner `run` returned

    def per_layout(self) -> float:
        """The wall time of one measurement: the mean so far, or --seconds plus START_UP_S before the first."""
        walls = [r.wall_s for t in self.trials for r in t.results if r.wall_s > 0]
        return statistics.fmean(walls) if walls else self.seconds + START_UP_S

    def planned_layouts(self) -> int:
        """How many layouts the budget holds (two measurements kept back for the confirmation)."""
        n = int(self.budget // (self.seconds + START_UP_S)) - (2 if self.confirm else 0)
        n = max(1, n)
        return min(n, self.max_layouts) if self.max_layouts else n

    def run(self) -> Trial:
        """Search, then confirm; the winner (the start when nothing measured beat it)."""
        t0 = time.monotonic()
        deadline = t0 + self.budget
        self._measure(Trial(1, self.start, "start"))
        while len(self.trials) < self.planned_layouts():
            leading = self.winner() is not self.trials[0]  # another layout leads: keep time to confirm it
            reserve = 2 * self.per_layout() if self.confirm and leading else 0.0
            if time.monotonic() + self.per_layout() + reserve > deadline:
                break
            found = self.next_layout()
            if found is None:
                break
            made, why, parent, move = found
            self._measure(Trial(len(self.trials) + 1, made, why, parent=parent, move=move))
        winner = self.winner()
        start = self.trials[0]
        if self.confirm and winner is not start and start.ok \
                and time.monotonic() + 2 * self.per_layout() <= deadline:
            for trial in (start, winner):
                trial.results.append(self.measure(trial.config, f"layout{trial.number}-again"))
            self.confirmed = True
            # the two measured twice decide: a layout measured once does not win on one lucky run
            winner = winner if winner.score > start.score else start
        self.final = winner
        return winner

    def _measure(self, trial: Trial) -> None:
        trial.results.append(self.measure(trial.config, f"layout{trial.number}"))
        self.trials.append(trial)
        self.on_trial(trial)

    def winner(self) -> Trial:
        ok = [t for t in self.trials if t.ok]
        return max(ok, key=lambda t: t.score) if ok else self.trials[0]

    def backfired(self) -> set[tuple[str, int]]:
        """The moves (setting, value) that cost a layout more than half its steps/s (or broke it): on this machine
        they are not worth measuring again elsewhere (e.g. as many learner threads as cores beside busy workers)."""
        return {(t.move.name, t.move.value) for t in self.trials if t.move is not None and t.parent is not None
                and (not t.ok or t.result.score < BACKFIRED * t.parent.result.score)}

    def next_layout(self) -> tuple[Config, str, Trial, Move] | None:
        """The next layout to measure, why, and the layout and move it comes from; None when every move of every
        measured layout was tried."""
        tried = {key(t.config) for t in self.trials}
        skip = self.backfired()
        ranked = sorted((t for t in self.trials if t.ok), key=lambda t: -t.score)
        ranked = [t for t in ranked if t.score >= BACKFIRED * ranked[0].score] if ranked else []  # none far slower
        for trial in ranked:
            r = trial.result
            for move, made in moves(trial.config, r.verdict, r.dropped_share, self.cores, self.reference):
                if key(made) not in tried and (move.name, move.value) not in skip:
                    said = LABELS.get(r.verdict or "", "no verdict")
                    dropping = f", drops {r.dropped_share:.0%}" if r.dropped_share > 0.01 else ""
                    return made, f"#{trial.number} {said}{dropping}: {move.why} ({move.flag})", trial, move
        for trial in ranked[:1]:  # every verdict's moves of the best layout
            for kind in KINDS:
                for move, made in moves(trial.config, kind, 0.0, self.cores, self.reference):
                    if key(made) not in tried and (move.name, move.value) not in skip:
                        return made, f"#{trial.number}'s neighbour: {move.why} ({move.flag})", trial, move
        return None

    def ratio(self) -> float | None:
        """The winner's steps/s over the start's (means over their measurements), or None without both."""
        start, winner = self.trials[0], self.final or self.winner()
        if not start.ok or start.score <= 0:
            return None
        return winner.score / start.score
