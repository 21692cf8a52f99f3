"""`sf2_train`: Sample Factory 2 training the same VizDoom scenario, for its env frames/s beside asyncrl's.

Sample Factory runs from its own interpreter (`--sf2-python`, a virtual environment with `sample-factory` and
`vizdoom`; never asyncrl's), as its example `python -m sf_examples.vizdoom.train_vizdoom` on the CPU with the
bench's layout (workers, envs per worker, 2 splits, rollout, 1 epoch of `minibatches` minibatches that make up
`batch_size`: Sample Factory's `--batch_size` is the minibatch). Its runner logs
`Fps is (...). Total num frames: N` every 5 s; each pair of consecutive lines after the first frames and one
warm-up line is a window (frames / seconds between the two log times). The count moves a learner batch at a
time (4,096 frames for a batch of 1,024), so a 5 s window is coarse: `sps_mean`, over the whole measurement,
is the finer figure. Once `repeats` windows covering
`seconds` are logged, the run is stopped with SIGINT to its process group, as Ctrl-C would, and any VizDoom
engine left behind is killed and its shared memory removed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from asyncrl.bench.settings import BenchSettings
from asyncrl.bench.windows import make_record

REPORT_S = 5.0  # Sample Factory's runner logs its frame count every 5 s
STARTUP_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
FRAMESKIP = 4
FPS_LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] Fps is .*?Total num frames: (\d+)")
SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")


class SampleFactoryFailed(RuntimeError):
    """Sample Factory exited, or logged no frames, before the measurement was complete."""


def frame_reports(log: str) -> list[tuple[float, int]]:
    """(seconds since the epoch, total env frames) of each `Fps is` line of a Sample Factory log."""
    reports = []
    for stamp, frames in FPS_LINE.findall(log):
        t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        reports.append((t, int(frames)))
    return reports


def measured_marks(reports: list[tuple[float, int]], repeats: int) -> list[tuple[float, int]] | None:
    """The `repeats` + 1 reports bounding the windows (after the first report with frames and a warm-up one);
    None until they are all logged."""
    first = next((i for i, (_, frames) in enumerate(reports) if frames > 0), None)
    if first is None:
        return None
    marks = reports[first + 1:first + 2 + repeats]
    return marks if len(marks) == repeats + 1 else None


def window_fps(marks: list[tuple[float, int]]) -> list[float]:
    """Frames/s between consecutive reports."""
    return [(f1 - f0) / (t1 - t0) for (t0, f0), (t1, f1) in zip(marks, marks[1:]) if t1 > t0]


def sf2_device(device: str) -> str:
    """Sample Factory's `--device` (gpu or cpu) for the bench's: the same device as asyncrl's row."""
    from asyncrl.bench.machine import resolve_bench_device

    return "gpu" if resolve_bench_device(device).startswith("cuda") else "cpu"


def sf2_command(python: str, s: BenchSettings, train_dir: str) -> list[str]:
    return [python, "-m", "sf_examples.vizdoom.train_vizdoom", f"--env={s.env}", "--experiment=bench",
            f"--train_dir={train_dir}", f"--device={sf2_device(s.device)}", f"--num_workers={s.workers}",
            f"--num_envs_per_worker={s.envs_per_worker}", f"--worker_num_splits={s.worker_splits}",
            f"--rollout={s.rollout}", f"--batch_size={s.batch_size // s.minibatches}",  # its minibatch
            f"--num_batches_per_epoch={s.minibatches}", f"--num_epochs={s.epochs}", "--with_wandb=False",
            *s.extra_trainer_args]  # `asyncrl-bench --mode sf2_train ... -- --use_rnn=False`


def _engines(pid: int) -> list[Any]:
    import psutil

    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "vizdoom"]
    except psutil.Error:
        return []


def _instance_id(engine: Any) -> str | None:
    try:
        args = engine.cmdline()
    except Exception:  # noqa: BLE001 - gone already
        return None
    return args[args.index("+viz_instance_id") + 1] if "+viz_instance_id" in args else None


def stop_process_group(proc: subprocess.Popen, grace_s: float = STOP_TIMEOUT_S) -> None:
    """SIGINT to the run's process group (as Ctrl-C), then SIGKILL after `grace_s`."""
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _stop(proc: subprocess.Popen, engines: list[Any]) -> None:
    """SIGINT to the whole group, then SIGKILL; then any engine still alive, and its shared memory."""
    import psutil

    ids = [i for i in map(_instance_id, engines) if i]
    stop_process_group(proc)
    for engine in engines:
        try:
            engine.kill()
        except psutil.Error:
            pass
    for i in ids:
        for prefix in SHM_PREFIXES:
            Path(f"/dev/shm/{prefix}{i}").unlink(missing_ok=True)


def run_sample_factory(s: BenchSettings) -> dict[str, Any]:
    """One Sample Factory training run of `s.env` by `s.sf2_python`; a record like the `train` mode's."""
    python = s.sf2_python
    if s.seconds < REPORT_S * 2:
        raise ValueError(f"Sample Factory logs every {REPORT_S:g} s: give --seconds >= {2 * REPORT_S:g}")
    repeats = max(2, int(s.seconds // REPORT_S))
    train_dir = tempfile.mkdtemp(prefix="asyncrl-bench-sf2-")
    log_path = Path(train_dir) / "sf2.log"
    cmd = sf2_command(python, s, train_dir)
    started = time.monotonic()
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=train_dir,
                                    start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            engines: list[Any] = []
            try:
                deadline = started + STARTUP_TIMEOUT_S + REPORT_S * (repeats + 2)
                while (marks := measured_marks(frame_reports(log_path.read_text(errors="replace")), repeats)) is None:
                    if proc.poll() is not None:
                        raise SampleFactoryFailed(f"Sample Factory exited with code {proc.returncode} before the "
                                                  f"measurement was complete:\n{_tail(log_path)}")
                    if time.monotonic() > deadline:
                        raise SampleFactoryFailed(f"no complete measurement within {deadline - started:.0f} s:\n"
                                                  f"{_tail(log_path)}")
                    engines = _engines(proc.pid) or engines
                    time.sleep(1.0)
            finally:
                _stop(proc, engines or _engines(proc.pid))
        fps = window_fps(marks)
        (t0, f0), (t1, f1) = marks[0], marks[-1]
        return make_record(s, [f / FRAMESKIP for f in fps], FRAMESKIP, limited_by=None,
                           fps_windows=[round(f, 1) for f in fps], sps_mean=round((f1 - f0) / (t1 - t0) / FRAMESKIP, 1),
                           sf2_command=[os.path.basename(python), *cmd[1:3], *[a for a in cmd[3:]
                                                                            if not a.startswith("--train_dir")]],
                           sf2_version=_sf2_version(python)) | {"window_s": REPORT_S}
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)


def _sf2_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('sample-factory'))"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
