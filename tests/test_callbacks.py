"""asyncrl.train(callbacks=[...]): every metrics record, checkpoint and evaluation reaches the caller's callables;
returning False stops the run cleanly within one report interval; a raising callback stops it with one line."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

import asyncrl
from asyncrl.diagnostics.metrics import read_metrics
from tests import launcher

REPORT_INTERVAL = 0.5
STOP_AT_RECORD = 4  # the callback asks to stop at this many metrics records

SCRIPT = textwrap.dedent("""\
    import json
    import sys

    import asyncrl

    SMALL = dict(env="CartPole-v1", workers=2, envs_per_worker=4, batch_size=256, device="cpu",
                 report_interval={interval}, seconds=120, train_dir=sys.argv[1])
    events, heard = [], []

    def watch(record):
        events.append(record)
        return not (record["event"] == "metrics" and sum(e["event"] == "metrics" for e in events) >= {stop_at})

    class Boom:
        def __call__(self, record):
            if record["event"] == "metrics" and record["frames"] > 0:
                raise ValueError("boom")

    if __name__ == "__main__":
        result = asyncrl.train(experiment="stopped", callbacks=[watch], **SMALL)
        print("STOPPED " + json.dumps({{"stop_reason": result.stop_reason, "exit_code": result.exit_code,
                                        "events": events}}))
        try:
            asyncrl.train(experiment="raised", callbacks=[Boom()], **SMALL)
        except asyncrl.TrainingFailed as exc:
            print("RAISED " + json.dumps({{"exit_code": exc.result.exit_code, "run_dir": exc.result.run_dir}}))
        # Evaluations: the final one (at --frames, after the samplers stopped) always comes; periodic ones may
        # wait on a busy machine, where the evaluator takes only idle CPU.
        unlimited = {{k: v for k, v in SMALL.items() if k != "seconds"}}
        asyncrl.train(experiment="evaluated", callbacks=[heard.append], frames=2048, eval_every=1024,
                      eval_episodes=1, **unlimited)
        print("EVALUATED " + json.dumps({{"events": heard}}))
""")


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("callbacks")
    script = root / "with_callbacks.py"
    script.write_text(SCRIPT.format(interval=REPORT_INTERVAL, stop_at=STOP_AT_RECORD))
    proc = launcher.run(f"{launcher.SCRIPT}{script}", [str(root / "train")], cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "train", proc


def _line(proc: subprocess.CompletedProcess, tag: str) -> dict:
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith(tag + " "))[len(tag) + 1:])


def test_a_callback_sees_every_record_and_stops_the_run_within_one_interval(scripted) -> None:
    train_dir, proc = scripted
    out = _line(proc, "STOPPED")
    assert out["stop_reason"] == "callback" and out["exit_code"] == 0
    events = out["events"]
    metrics = [e for e in events if e["event"] == "metrics"]
    written = read_metrics(str(train_dir / "stopped"))
    # Every record written to metrics.jsonl reached the callback, in order, with the same values.
    assert [r["frames"] for r in written] == [m["frames"] for m in metrics]
    assert all(m["episode_return_mean"] == r["episode_return_mean"] for m, r in zip(metrics, written))
    # The run stopped at the record that asked it to: at most the tail record follows, within one interval.
    asked = next(i for i, e in enumerate(events) if e["event"] == "metrics"
                 and sum(x["event"] == "metrics" for x in events[:i + 1]) >= STOP_AT_RECORD)
    stop = events[asked]
    assert len([e for e in events[asked + 1:] if e["event"] == "metrics"]) <= 1
    assert metrics[-1]["time"] - stop["time"] <= REPORT_INTERVAL + 1.0
    # A final checkpoint was saved after the stop, and the callback heard of it.
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoints and checkpoints[-1]["env_steps"] >= stop["env_steps"]
    assert Path(checkpoints[-1]["path"]).exists()
    assert "stopping (callback)" in proc.stdout


def test_evaluations_reach_the_callback(scripted) -> None:
    events = _line(scripted[1], "EVALUATED")["events"]
    evals = [e for e in events if e["event"] == "eval"]
    assert evals and all("eval_return_mean" in e and e["eval_return_mean"] > 0 for e in evals)
    assert evals[-1]["eval_frames"] >= 2048  # the final weights' evaluation
    last_record = [e for e in events if e["event"] == "metrics"][-1]
    assert last_record["eval_return_mean"] == evals[-1]["eval_return_mean"]  # and it is in the last record


def test_a_raising_callback_stops_the_run_with_one_line_naming_it(scripted) -> None:
    train_dir, proc = scripted
    out = _line(proc, "RAISED")
    assert out["exit_code"] == 1
    lines = [x for x in proc.stderr.splitlines() if "Boom" in x]
    assert len(lines) == 1 and "callback Boom raised ValueError: boom" in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert list((train_dir / "raised" / "checkpoints").glob("ckpt_*.pt"))  # the final save still happened


def test_a_callback_that_is_not_callable_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="callables taking one dict"):
        asyncrl.train(env="CartPole-v1", train_dir=str(tmp_path), callbacks=[42])
    assert not any(tmp_path.iterdir())
