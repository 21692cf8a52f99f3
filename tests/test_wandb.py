"""--wandb: a short CartPole run logged offline (WANDB_MODE=offline), read back from W&B's own run file."""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.cli.train import main as train_main
from tests import launcher

LOG_HEADER, LOG_BLOCK, RECORD_HEADER = 7, 32768, 7  # the .wandb file: a LevelDB-style log of protobuf records


def wandb_records(path: Path) -> Iterator[object]:
    """Every `Record` in an offline run's `run-<id>.wandb` (wandb 0.2x+ no longer ships a Python reader)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, pending = LOG_HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        left = LOG_BLOCK - pos % LOG_BLOCK
        if left < RECORD_HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + RECORD_HEADER])
        if kind == 0 and length == 0:
            break
        pending += data[pos + RECORD_HEADER:pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_logs_scalars_config_and_eval_video(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    args = ["--env", "CartPole-v1", "--frames", "3000", "--workers", "2", "--report-interval", "1",
            "--eval-every", "1500", "--eval-episodes", "1", "--eval-video", "--wandb", "--wandb-project", "proj",
            "--wandb-group", "grp", "--wandb-tags", "a, b", "--train-dir", str(tmp_path), "--experiment", "wb"]
    done = launcher.run("train", args, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = list((tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, list((tmp_path / "wb").rglob("*"))

    history, run_info, config = [], None, {}
    for record in wandb_records(runs[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "run":
            run_info = record.run
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    assert run_info is not None and run_info.project == "proj" and run_info.run_group == "grp"
    assert list(run_info.tags) == ["a", "b"]
    assert config.get("eval_every") == 1500 and config.get("env") == "CartPole-v1"
    # The TensorBoard scalars under the same namespaced tags, at the same steps (frames).
    assert any("episode/episode_return_mean" in h and "perf/fps" in h for h in history)
    assert all(h["_step"] == h["perf/frames"] for h in history if "perf/frames" in h)
    evals = [h for h in history if "eval/eval_return_mean" in h]
    assert evals and all(h["eval/eval_return_mean"] >= 1 for h in evals)
    videos = [h for h in history if "eval/eval_video/_type" in h]  # a media value's fields are logged flat
    assert videos and videos[0]["eval/eval_video/_type"] == "video-file"
    assert (runs[0].parent / "files" / videos[0]["eval/eval_video/path"]).stat().st_size > 0


def test_wandb_without_the_package_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what find_spec sees when wandb is not installed
    code = train_main(["--env", "CartPole-v1", "--train-dir", str(tmp_path), "--wandb"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "pip install -e '.[wandb]' in the asyncrl checkout" in err
