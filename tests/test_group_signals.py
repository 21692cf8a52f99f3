"""A stop signal to the whole process group (docker stop, scancel, systemd, a closed terminal) still saves."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from asyncrl.runtime.store.checkpoint import list_checkpoints
from tests.conftest import read_metrics, shm_entries, start_train, wait_for

COMMON = ["--workers", "2", "--checkpoint-interval", "3600", "--report-interval", "1", "--seconds", "600"]
# CartPole for both signals: the group path (every process gets the signal, the runner drives the stop) is the same
# whatever the env; stopping during a long Pong update, which the stop waits for, is test_e2e's Pong Ctrl-C (SIGINT
# to the group) at 32 workers. The Pong case here cost ~16 s more of test time.
ENVS = {signal.SIGTERM: ["--env", "CartPole-v1", "--envs-per-worker", "8"],
        signal.SIGHUP: ["--env", "CartPole-v1", "--envs-per-worker", "8"]}


def _group(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.mark.parametrize("sig", list(ENVS), ids=[s.name for s in ENVS])
def test_stop_signal_to_the_process_group_saves_a_final_checkpoint(sig: signal.Signals, tmp_path: Path,
                                                                   reap: list) -> None:
    before_shm = shm_entries()
    run = start_train([*ENVS[sig], *COMMON], tmp_path / "train")
    reap.append(run)
    pgid = run.pid  # start_new_session: the runner leads its own group
    # After the first update is reported (version 2): the signal then meets the learner in its next.
    versions = wait_for(lambda: [r["policy_version"] for r in read_metrics(run.run_dir) if r["policy_version"] >= 2],
                        timeout=300, proc=run.proc)
    assert versions, run.stdout()[-2000:] + run.stderr()[-2000:]
    assert len(_group(pgid)) >= 5  # runner, learner, policy worker, 2 rollout workers
    os.killpg(pgid, sig)
    sent = time.monotonic()
    code = run.wait(timeout=120)
    waited = time.monotonic() - sent
    out, err = run.stdout(), run.stderr()
    assert code == 0, out[-2000:] + err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"stopping ({sig.name})" in out
    saved = list_checkpoints(str(run.run_dir))
    assert saved, f"no final checkpoint\n{err[-2000:]}"
    reported = read_metrics(run.run_dir)[-1]["policy_version"]
    assert int(re.search(r"ckpt_(\d+)", saved[0]).group(1)) >= reported >= versions[0]  # nothing reported is lost
    # The runner's own timeline: from noticing the signal to the end of the shutdown (the machine may be busy,
    # so the outer wait is generous).
    line = re.search(r"final checkpoint (ckpt_\d+\.pt) \(policy version (\d+), .*stopped ([\d.]+) s after "
                     + sig.name, out)
    assert line, out[-2000:]
    assert float(line.group(3)) <= 10.0, line.group(0)
    assert waited < 60, waited
    newest = list_checkpoints(str(run.run_dir))[0]
    assert os.path.basename(newest) == line.group(1)
    saved_version = int(line.group(2))
    assert int(re.search(r"ckpt_(\d+)", newest).group(1)) == saved_version
    assert wait_for(lambda: not _group(pgid), timeout=10), [p.name() for p in _group(pgid)]
    assert ours(shm_entries() - before_shm) == set()  # other programs on the machine may come and go


def ours(entries: set[str]) -> set[str]:
    """What this project could leave in /dev/shm: multiprocessing arenas (faster-fifo) or named asyncrl files."""
    return {e for e in entries if e.startswith(("pym-", "asyncrl", "psm_", "mp-"))}
