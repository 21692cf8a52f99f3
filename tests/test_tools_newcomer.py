"""The offline tools in a newcomer's first hour: one-line usage errors, a diagnosis that knows a run ended and on
which device it trained, a plot that refuses a run too short to draw, an export that says what it creates, and
`enjoy --video` quiet on a machine without sound or display."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from asyncrl.cli.export import missing_dir
from asyncrl.diagnostics.metrics import STOP_RECORD, MetricsWriter, read_stop_record
from asyncrl.diagnostics.rundir import load_run
from asyncrl.diagnostics.screens import quiet_headless
from tests.run_records import fractions, run_records


def write_run(path: Path, records: list[dict], config: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "config.json").write_text(json.dumps(config or {"env": "CartPole-v1", "device": "auto"}))
    return path


@pytest.mark.parametrize("module, argv", [("plot", []), ("diagnose", []), ("enjoy", ["RUN", "--episodes", "x"]),
                                          ("export", ["RUN"]), ("compare", []), ("sweep", [])])
def test_every_tools_usage_error_is_one_line(module: str, argv: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(f"asyncrl.cli.{module}").main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"asyncrl-{module}: error: ") and "usage:" not in err
    assert err.endswith(f"(see asyncrl-{module} --help)\n")


def test_a_run_writes_a_stop_record_and_a_resumed_one_removes_it(tmp_path: Path) -> None:
    writer = MetricsWriter(str(tmp_path))
    writer.write({"time": 11.0, "frames": 150_000, "fps": 13_000.0}, step=150_000)
    assert read_stop_record(str(tmp_path)) is None  # running
    writer.close()
    stopped = read_stop_record(str(tmp_path))
    assert stopped is not None and (stopped["time"], stopped["frames"]) == (11.0, 150_000)
    MetricsWriter(str(tmp_path)).close()  # a resume: running again, then stopped again
    assert (tmp_path / STOP_RECORD).exists()
    running = MetricsWriter(str(tmp_path))
    assert not (tmp_path / STOP_RECORD).exists()
    running.close()


def test_diagnose_reads_the_stop_record_and_names_the_device_used(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import diagnose

    recs = run_records(6, env_steps=lambda i: 10_000 * (i + 1), dropped_stale=lambda i: 8_200 * (i + 1))
    run = write_run(tmp_path / "run", recs)
    (run / STOP_RECORD).write_text(json.dumps({"stopped_at": 0.0, "time": 30.0, "frames": 60_000}))
    assert diagnose.main([str(run)]) == 0
    md = Path(capsys.readouterr().out.strip()).read_text()
    assert "- status: finished: stopped at 60,000 frames" in md
    assert "device cpu (--device auto: no GPU was in use)" in md
    assert "**stale_dropped**: 82% of the samples were dropped" in md and "None detected" not in md
    on_gpu = write_run(tmp_path / "gpu", run_records(3, gpu_util=50.0))
    assert diagnose.main([str(on_gpu)]) == 0
    md = (on_gpu / "diagnosis.md").read_text()
    assert "device cuda (--device auto)" in md
    assert "- status: running (no stop record yet" in md  # metrics.jsonl written just now, no stop record


def test_plot_refuses_a_run_of_one_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import plot

    run = write_run(tmp_path / "short", run_records(1))
    out = tmp_path / "curves.png"
    assert plot.main([str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 1 record with 'episode_return_mean', too few for a curve" in err
    assert not out.exists()


def test_export_says_which_directories_it_would_create(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli.export import main

    assert missing_dir(str(tmp_path / "a" / "b")) == str(tmp_path / "a")
    assert missing_dir(str(tmp_path)) is None
    assert main([str(tmp_path / "nope"), "--format", "onnx", "--out", str(tmp_path / "a" / "b" / "p.onnx")]) == 2
    assert not (tmp_path / "a").exists()  # a refused export creates nothing
    assert capsys.readouterr().err.count("\n") == 1


def test_enjoy_quiets_sdl_on_a_headless_machine(tmp_path: Path) -> None:
    no_cards = tmp_path / "cards"
    no_cards.write_text("--- no soundcards ---\n")
    env: dict[str, str] = {}
    assert quiet_headless(env, str(no_cards)) == ["SDL_AUDIODRIVER", "SDL_VIDEODRIVER"]
    assert env == {"SDL_AUDIODRIVER": "dummy", "SDL_VIDEODRIVER": "dummy"}
    mine = {"SDL_AUDIODRIVER": "pulse", "DISPLAY": ":0"}
    assert quiet_headless(mine, str(tmp_path / "absent")) == [] and mine["SDL_AUDIODRIVER"] == "pulse"
    cards = tmp_path / "one"
    cards.write_text(" 0 [PCH            ]: HDA-Intel - HDA Intel PCH\n")
    assert quiet_headless({"DISPLAY": ":0"}, str(cards)) == []


def test_load_run_keeps_the_stop_record(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", run_records(2))
    assert load_run(str(run)).stopped is None
    (run / STOP_RECORD).write_text(json.dumps({"stopped_at": 1.0, "frames": 20_000}))
    assert load_run(str(run)).stopped == {"stopped_at": 1.0, "frames": 20_000}


def test_diagnose_gives_no_throughput_advice_to_a_solved_run() -> None:
    from asyncrl.diagnostics.report import bottleneck_section

    busy = fractions(env=0.01, infer=0.30, lwait=0.02, copy=0.01, train=0.97)  # training-bound: "train on a GPU"
    solved = "\n".join(bottleneck_section(run_records(4, episode_return_mean=500.0, **busy), "CartPole-v1"))
    assert "no change needed" in solved and "--device cuda" not in solved
    learning = "\n".join(bottleneck_section(run_records(4, episode_return_mean=100.0, **busy), "CartPole-v1"))
    assert "--device cuda" in learning
