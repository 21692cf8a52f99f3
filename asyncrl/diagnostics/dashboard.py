"""The live terminal dashboard: one `rich` screen, redrawn once a second, fed by the run's metrics records.

When stdout is a terminal (and --dashboard is on, the default), the runner's `RunBook.report` hands each metrics
record to `Dashboard.update` instead of printing the progress line; logs, pipes and CI keep the line. The screen
shows steps/s and frames/s with their recent history, each stage's share of its processes' time and the bottleneck
verdict, policy lag and dropped samples, queue depths, CPU and memory per process kind (GPU where sampled), the
learner's losses, entropy, KL and gradient norm, the episode return with its history, and the ETA. When the learner
is the bottleneck or stale samples are dropped it shows the one flag change asyncrl-tune would try first
(asyncrl.diagnostics.layout_moves.suggestion).

Its own cost is on the screen: its CPU time (time.thread_time around each redraw, which lays out and writes the
frame, and around `update`) against the run's CPU time (its processes' `cpu_total` over each interval).

Forking: the runner forks workers (and restarts them) while the screen is live. A fork waits for a redraw in
progress to end (os.register_at_fork), so no child starts with rich's or stdout's lock held, and a child gets the
real stdout and stderr back (not the screen's redirection).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import Any

from asyncrl.config import Config
from asyncrl.diagnostics.bottleneck import LABELS
from asyncrl.diagnostics.layout_moves import suggestion
from asyncrl.diagnostics.progress import ProgressLine, dropped_share, format_duration, lag_text
from asyncrl.diagnostics.resources import process_type

HISTORY = 48  # records kept for the sparklines (4 minutes at the default 5 s report interval)
SPARK = 30  # the steps/s sparkline's points (its panel's width)
REFRESH_S = 1.0
BLOCKS = "▁▂▃▄▅▆▇█"
STAGES = (("env stepping (rollout workers)", "rollout_env_frac"), ("inference (policy workers)", "policy_infer_frac"),
          ("training (learner)", "learner_train_frac"), ("copying batches (learner)", "learner_copy_frac"),
          ("learner waiting for data", "learner_wait_frac"))
LEARNER_KEYS = ("entropy", "kl", "grad_norm", "alpha", "q_mean", "learning_rate")
QUEUES = ("requests", "full", "free")


def wanted(cfg: Config, stream: Any = None) -> bool:
    """The dashboard is on for this run: --dashboard (the default), stdout a terminal that can draw it, and one
    rank (torchrun's ranks share the terminal: they print lines)."""
    from asyncrl.system import local_world_size

    stream = sys.stdout if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return bool(cfg.dashboard and tty and os.environ.get("TERM", "") != "dumb" and local_world_size() == 1)


def sparkline(values: list[float], width: int = HISTORY) -> str:
    """`▁▂▄▇█` over the last `width` values, scaled between their min and max."""
    xs = [float(v) for v in values[-width:] if isinstance(v, int | float)]
    if not xs:
        return ""
    lo, hi = min(xs), max(xs)
    if hi - lo < 1e-12:
        return BLOCKS[3] * len(xs)
    return "".join(BLOCKS[min(7, int((x - lo) / (hi - lo) * 8))] for x in xs)


def bar(share: float, width: int = 20) -> str:
    filled = max(0, min(width, round(share * width)))
    return "█" * filled + "·" * (width - filled)


def _num(value: Any, digits: int = 3) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:,.0f}"


class Dashboard:
    """One run's screen. `update` is called with each metrics record (cheap: it keeps the record); a thread of its
    own redraws once a second."""

    def __init__(self, cfg: Config, cores: int | None = None):
        from asyncrl.system import usable_cpus

        self.cfg = cfg
        self.cores = cores or usable_cpus()
        self.progress = ProgressLine(cfg.frames, cfg.seconds)
        self.record: dict[str, Any] = {}
        self.sps: deque[float] = deque(maxlen=HISTORY)
        self.returns: deque[float] = deque(maxlen=HISTORY)
        self.eta: tuple[float, float | None] | None = None
        self.learner_stats: dict[str, Any] = {}  # the newest record with learner stats (an update may outlast one)
        self.suggestion: str | None = None
        self.draw_cpu_s = 0.0  # CPU time of the redraws and of taking in the records
        self.run_cpu_s = 0.0  # the run's processes' CPU time over the records seen
        self.redraws = 0
        self._last_time: float | None = None
        self._t_update = time.monotonic()
        self._lock = threading.Lock()  # held by a redraw; a fork waits for it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.live: Any = None
        self._body: Any = None  # the laid-out lines of the newest record's panels, and what they were laid out for
        self._body_key: tuple | None = None
        self._streams = (sys.stdout, sys.stderr)

    # ----- lifecycle -----
    def start(self, console: Any = None) -> None:
        """Show the screen (`console`: rich's Console for stdout, or another for a test) and start redrawing."""
        global _ACTIVE
        from rich.console import Console
        from rich.live import Live

        self._streams = (sys.stdout, sys.stderr)
        console = console or Console()
        self.live = Live(self.render(), console=console, auto_refresh=False, redirect_stdout=True,
                         redirect_stderr=True, transient=False)
        self.live.start()
        _ACTIVE = self
        self._thread = threading.Thread(target=self._redraw_loop, name="asyncrl-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Draw the last frame and leave it on the terminal; stdout and stderr are the terminal's again."""
        global _ACTIVE
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.live is not None:
            with self._lock:
                self._redraw()
                self.live.stop()
            self.live = None
        if _ACTIVE is self:
            _ACTIVE = None

    def _redraw_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                self._redraw()

    def _redraw(self) -> None:
        t0 = time.thread_time()
        try:
            self.live.update(self.render(), refresh=True)
        except Exception:  # noqa: BLE001 - a screen is never worth failing the run for (a closed terminal)
            self._stop.set()
        self.draw_cpu_s += time.thread_time() - t0
        self.redraws += 1

    # ----- data -----
    def update(self, record: dict[str, Any], loop_seconds: float | None = None) -> None:
        """Keep one metrics record (the runner's thread; the redraw thread reads it)."""
        t0 = time.thread_time()
        t, cpu = record.get("time"), record.get("cpu_total")
        if isinstance(t, int | float) and self._last_time is not None and isinstance(cpu, int | float):
            self.run_cpu_s += cpu / 100.0 * max(0.0, t - self._last_time)
        self._last_time = t if isinstance(t, int | float) else self._last_time
        eta = self.progress.done_and_eta(record["time"], record["frames"], loop_seconds)
        advice = suggestion(self.cfg, record, self.cores)
        with self._lock:
            self.record = record
            if record.get("learner_updates"):
                self.learner_stats = record
            self.sps.append(float(record.get("sps") or 0.0))
            ret = record.get("episode_return_mean")
            if isinstance(ret, int | float):
                self.returns.append(float(ret))
            self.eta = eta
            self.suggestion = advice
            self._t_update = time.monotonic()
            self.draw_cpu_s += time.thread_time() - t0

    def cost_text(self) -> str:
        """`this screen: 0.04 s of CPU, 0.1% of the run's 41 s`."""
        if self.run_cpu_s <= 0:
            return f"this screen: {self.draw_cpu_s:.2f} s of CPU"
        return (f"this screen: {self.draw_cpu_s:.2f} s of CPU, {100 * self.draw_cpu_s / self.run_cpu_s:.1f}% of the "
                f"run's {self.run_cpu_s:,.0f} s")

    # ----- drawing -----
    def render(self) -> Any:
        """The screen: the header line (its clock and ETA tick every redraw) over the newest record's panels, which
        are laid out once per record and their lines reused until the next (a redraw then costs little more than
        writing the frame)."""
        from rich.console import Group
        from rich.text import Text

        footer = Text(f"{self.cost_text()} · --no-dashboard prints the progress line instead", style="dim")
        return Group(self.head(), self._cached_body(), footer)

    def head(self) -> Any:
        from rich.text import Text

        r, cfg = self.record, self.cfg
        since = time.monotonic() - self._t_update
        elapsed = (r.get("time") or 0.0) + (since if r else 0.0)
        head = Text.assemble((" asyncrl ", "bold reverse"), f"  {cfg.env} ({cfg.algo})  ", (cfg.run_dir, "dim"),
                             f"   {format_duration(elapsed)}")
        if self.eta is not None:
            done, left = self.eta
            left_now = None if left is None else max(0.0, left - since)
            head.append(f"   {min(done, 1.0):.0%} done, ETA {'-' if left_now is None else format_duration(left_now)}",
                        style="bold")
        return head

    def _cached_body(self) -> Any:
        from rich.segment import Segment, Segments

        console = self.live.console if self.live is not None else None
        if console is None:
            return self.body()
        key = (self._t_update, console.width)
        if self._body_key != key:
            lines = console.render_lines(self.body(), console.options, pad=False)
            self._body = Segments([seg for line in lines for seg in (*line, Segment.line())])
            self._body_key = key
        return self._body

    def body(self) -> Any:
        """The newest record's panels: columns padded by hand in Text (rich's Tables measure every nested cell several
        times; this lays the same screen out in a fraction of their CPU)."""
        from rich.console import Group
        from rich.panel import Panel
        from rich.text import Text

        r = self.record
        if not r:
            return Text("waiting for the first report...", style="dim")

        fs = (r.get("fps") or 0.0) / max(r.get("sps") or 1.0, 1e-9) if r.get("sps") else 1.0
        speed = columns([(f"{r.get('sps') or 0:,.0f}", "steps/s"),
                         ("", (sparkline(list(self.sps), SPARK), "cyan")),
                         (f"{r.get('fps') or 0:,.0f}", f"frames/s (x{fs:g})"),
                         (f"{r.get('frames', 0):,}", "frames"),
                         (f"{r.get('policy_version', '-')}", "policy version")], "><", styles=("bold", ""))

        stages = columns([(name, (bar(r[key]), "magenta"), f"{r[key]:.0%}") for name, key in STAGES
                          if isinstance(r.get(key), int | float)], "<<>")
        verdict = r.get("bottleneck")
        label = LABELS.get(verdict or "", "no verdict yet")
        why = Text.assemble(("bottleneck: ", "bold"), (label, "bold yellow" if verdict else "dim"),
                            f" ({r.get('bottleneck_reason')})" if r.get("bottleneck_reason") else "")

        data_rows = [("lag", lag_text(r).removeprefix("lag ")), ("dropped", f"{dropped_share(r)} (stale)")]
        data_rows += [(f"{q} queue", f"{r[f'queue_{q}']:.1f}") for q in QUEUES
                      if isinstance(r.get(f"queue_{q}"), int | float)]
        data = columns(data_rows, "<<", styles=("bold", ""))

        kinds: dict[str, list[float]] = {}
        for name, p in (r.get("procs") or {}).items():
            k = kinds.setdefault(process_type(name), [0.0, 0.0, 0])
            k[0] += p.get("cpu") or 0.0
            k[1] += p.get("rss_mb") or 0.0
            k[2] += 1
        proc_rows = [("process", "CPU %", "RSS MB")]
        proc_rows += [(f"{kind}{f' x{n}' if n > 1 else ''}", f"{cpu:.0f}", f"{rss:,.0f}")
                      for kind, (cpu, rss, n) in kinds.items()]
        if isinstance(r.get("cpu_system"), int | float):
            proc_rows.append((f"machine ({os.cpu_count()} cores)", f"{r['cpu_system']:.0f}%", ""))
        if isinstance(r.get("gpu_util"), int | float):
            proc_rows.append(("GPU", f"{r['gpu_util']:.0f}", f"{r.get('gpu_mem_mb', 0):,.0f}"))
        procs = columns(proc_rows, "<>>", styles=("bold", "", ""))

        stats = self.learner_stats
        learn_rows: list[tuple[Any, ...]] = [
            (key, _num(stats[key])) for key in [k for k in stats if k.endswith("_loss") and "/" not in k]
            + list(LEARNER_KEYS) if isinstance(stats.get(key), int | float)]
        learn_rows.append(("updates", f"{r.get('learner_updates', 0)} this interval"))
        if stats and stats is not r:
            learn_rows.append(("", (f"(as of version {stats.get('policy_version', '-')})", "dim")))
        learn = columns(learn_rows, "<>", styles=("bold", ""))

        ret = r.get("episode_return_mean")
        episodes = Text.assemble(("return ", "bold"), f"{_num(ret, 4)}  ", (sparkline(list(self.returns)), "green"),
                                 f"   {r.get('episodes', 0):,} episodes, length {_num(r.get('episode_len_mean'), 4)}")

        top = side_by_side(Panel.fit(speed, title="throughput", border_style="cyan"),
                           Panel.fit(data, title="data in flight", border_style="cyan"),
                           Panel.fit(procs, title="processes", border_style="cyan"))
        middle = side_by_side(Panel.fit(stages, title="time share per stage", border_style="magenta"),
                              Panel.fit(learn, title="learner", border_style="magenta"))
        parts: list[Any] = [top, middle, why, episodes]
        if self.suggestion:
            parts.append(Text.assemble(("do this: ", "bold red"), self.suggestion))
        alerts = r.get("alerts") or []
        if alerts:
            parts.append(Text(f"alerts: {', '.join(alerts)} (the lines above say what to do)", style="red"))
        return Group(*parts)


def columns(rows: list[tuple[Any, ...]], align: str, styles: tuple[str, ...] = ()) -> Any:
    """Rows of cells as one rich Text, each column padded to its widest cell (`align`: "<" or ">" per column); a
    cell is a string or (string, style); `styles` are the columns' default styles."""
    from rich.cells import cell_len
    from rich.text import Text

    cells = [[c if isinstance(c, tuple) else (str(c), "") for c in row] for row in rows]
    widths = [max((cell_len(row[i][0]) for row in cells if i < len(row)), default=0) for i in range(len(align))]
    text = Text()
    for n, row in enumerate(cells):
        if n:
            text.append("\n")
        for i, (value, style) in enumerate(row):
            pad = " " * (widths[i] - cell_len(value))
            if i:
                text.append(" ")
            text.append(pad if align[i] == ">" else "")
            text.append(value, style=style or (styles[i] if i < len(styles) else "") or None)
            text.append(pad if align[i] == "<" and i < len(row) - 1 else "")
    return text


class side_by_side:  # noqa: N801 - a renderable used like a function
    """Panels next to each other, each laid out once at its own natural width; those that do not fit the width go
    below."""

    def __init__(self, *panels: Any, gap: int = 2):
        self.panels, self.gap = panels, gap

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement
        from rich.segment import Segment

        rows: list[list[tuple[int, list]]] = [[]]
        used = 0
        for panel in self.panels:
            width = min(Measurement.get(console, options, panel).maximum, options.max_width)
            if rows[-1] and used + self.gap + width > options.max_width:
                rows.append([])
                used = 0
            lines = console.render_lines(panel, options.update_width(width), pad=True)
            rows[-1].append((width, lines))
            used += width + (self.gap if used else 0)
        for row in rows:
            height = max(len(lines) for _, lines in row)
            for i in range(height):
                for n, (width, lines) in enumerate(row):
                    if n:
                        yield Segment(" " * self.gap)
                    yield from (lines[i] if i < len(lines) else [Segment(" " * width)])
                yield Segment.line()


_ACTIVE: Dashboard | None = None  # the screen drawn in this process (forks wait for its redraw)


def _before_fork() -> None:
    if _ACTIVE is not None:
        _ACTIVE._lock.acquire()


def _after_fork_in_parent() -> None:
    if _ACTIVE is not None:
        _ACTIVE._lock.release()


def _after_fork_in_child() -> None:
    """A forked child draws nothing: the real stdout and stderr back, the screen forgotten."""
    global _ACTIVE
    if _ACTIVE is not None:
        sys.stdout, sys.stderr = _ACTIVE._streams
        _ACTIVE = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
