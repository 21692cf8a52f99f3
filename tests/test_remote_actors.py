"""Remote actor groups on a real Ray cluster of two nodes on this machine (loopback only): trajectories from
remote groups alone and beside local workers, SAC's replay fed remotely, a node killed mid-run, and the
refusals that need no cluster."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
import torch  # noqa: E402

from asyncrl.bench.ray_cluster import LocalCluster  # noqa: E402
from tests import launcher  # noqa: E402
from tests.conftest import read_metrics, run_cli, start_train, wait_for  # noqa: E402

SMALL = ["--env", "CartPole-v1", "--envs-per-worker", "8", "--worker-splits", "2", "--rollout", "16",
         "--batch-size", "256", "--report-interval", "1", "--device", "cpu", "--remote-envs-per-worker", "8"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head node and one more, one CPU each: each node takes one actor group."""
    c = LocalCluster(tmp_path_factory.mktemp("ray"), head_cpus=1, node_cpus=(1,))
    yield c
    c.stop()


def remote_records(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r.get("remote_groups") is not None]


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, words in [
        (["--remote-workers", "2", "--ray", "127.0.0.1:1", "--serial"], "drop --serial"),
        (["--remote-workers", "1"], "add --ray HOST:PORT"),
        (["--ray", "127.0.0.1:1"], "add --remote-workers"),
        (["--remote-workers", "1", "--ray", "127.0.0.1:1"], "no Ray cluster answers"),
        (["--remote-workers", "1", "--ray", "nonsense"], "is not HOST:PORT"),
        (["--remote-workers", "1", "--ray", "127.0.0.1:1", "--remote-envs-per-worker", "3"], "multiple of"),
    ]:
        proc = run_cli([*SMALL[:-2], "--frames", "1000", *args], tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "CartPole-v1").exists()  # nothing written


def test_ray_missing_names_the_extra(tmp_path):
    # `python SCRIPT` as a fork of the tests' warm interpreter (tests/launcher.py), which has not imported ray
    script = tmp_path / "no_ray.py"
    script.write_text("import sys; sys.modules['ray'] = None; from asyncrl.cli.console import train; "
                      f"sys.argv = ['asyncrl-train', '--env', 'CartPole-v1', '--remote-workers', '1', '--ray', "
                      f"'127.0.0.1:1', '--train-dir', {str(tmp_path)!r}]; train()\n")
    proc = launcher.run(f"{launcher.SCRIPT}{script}", [], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "pip install -e '.[ray]'" in proc.stderr, proc.stderr


def test_local_and_remote_together_then_sac(cluster, tmp_path):
    """A local worker beside a remote group, both with a GRU (both shares of the steps seen), then SAC's replay
    learner fed by a remote group alone (remote transitions in its buffer, updates on them)."""
    run = start_train([*SMALL, "--workers", "1", "--remote-workers", "1", "--ray", cluster.address, "--rnn", "gru",
                       "--rnn-size", "16", "--seconds", "120"], tmp_path, "mixed")  # the GRU's state travels too
    try:  # until a record has steps from both (the remote group starts a few seconds after the local worker)
        assert wait_for(lambda: any(0 < (r.get("remote_share") or 0) < 1 for r in run.records()), 120, run.proc), (
            run.stdout()[-2000:] + run.stderr()[-2000:])
        run.ctrl_c()
        assert run.wait(timeout=60) == 0, run.stderr()[-2000:]
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    # --utd 0.125: an update per 8 env steps, not SAC's one per step, which held sampling to about 70 env steps a
    # second here (the run took 13.5 s, 5.5 s with this; be09760, 2026-12-07)
    proc = run_cli(["--env", "Pendulum-v1", "--algo", "sac", "--workers", "0", "--remote-workers", "1",
                    "--ray", cluster.address, "--frames", "800", "--learning-starts", "300", "--utd", "0.125",
                    "--report-interval", "1", "--device", "cpu", "--experiment", "sac"], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = remote_records(tmp_path / "sac")
    assert records[-1]["env_steps"] >= 800
    assert all(r["remote_share"] == 1.0 for r in records if r["remote_share"] is not None)
    trained = [r for r in records if r.get("critic_loss") is not None]  # updates on remote transitions
    assert trained and trained[-1]["replay_size"] > 300 and trained[-1]["updates_total"] > 0


def test_remote_groups_alone_and_a_node_killed(cluster, tmp_path):
    """No local rollout worker: every env step comes from the two nodes' groups. Then SIGKILL of the second
    node's raylet: its group's loss is one warning line, the run goes on with the other group and ends with a
    final checkpoint that loads. (Last of the cluster's tests: the cluster keeps one node.)"""
    run = start_train([*SMALL, "--workers", "0", "--remote-workers", "2", "--ray", cluster.address,
                       "--seconds", "120"], tmp_path, "remote")

    def both_nodes() -> bool:
        records = remote_records(run.run_dir)
        nodes = {r.get(f"remote/{i}/node") for r in records for i in (0, 1)} - {None, "?"}
        return len(nodes) == 2 and records[-1]["env_steps"] > 2000

    try:
        assert wait_for(both_nodes, 120, run.proc), run.stdout()[-2000:] + run.stderr()[-2000:]
        assert "2 remote groups x 8 envs on Ray" in run.stdout()
        records = remote_records(run.run_dir)
        assert all(r["remote_share"] == 1.0 for r in records if r["remote_share"] is not None)
        assert any(r["remote_lag_mean"] is not None for r in records) and records[-1]["remote_bytes_per_s"] > 0
        cluster.kill_node(1)
        before = run.records()[-1]["env_steps"]
        assert wait_for(lambda: "died" in run.stdout() and run.records()[-1]["env_steps"] > before + 3000, 180,
                        run.proc), f"{before} env steps before the kill\n{run.stdout()[-3000:]}{run.stderr()[-2000:]}"
        run.ctrl_c()
        assert run.wait(timeout=60) == 0, run.stdout()[-3000:] + run.stderr()[-2000:]
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    out = run.stdout()
    warnings = [line for line in out.splitlines() if "remote group" in line and "died" in line]
    assert len(warnings) == 1 and warnings[0].startswith("asyncrl: remote group "), out[-3000:]
    ckpts = sorted((run.run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts and "final checkpoint" in out
    state = torch.load(ckpts[-1], map_location="cpu", weights_only=False)
    assert state["env_steps"] >= before


def test_verdict_names_remote_transfer():
    """Slots from remote groups slower than the learner takes them: the verdict says so; when the bridge waits for
    free slots instead, the learner is the limit and the remote verdict stays out."""
    from asyncrl.diagnostics.bottleneck import classify

    record = {"rollout_env_frac": None, "policy_infer_frac": None, "learner_wait_frac": 0.8,
              "learner_copy_frac": 0.02, "learner_train_frac": 0.15, "remote_share": 1.0, "remote_slots_per_s": 3.0,
              "remote_bytes_per_s": 2e6, "remote_wait_slot_frac": 0.0}
    verdict = classify(record)
    assert verdict is not None and verdict.kind == "remote" and "learner waits 80%" in verdict.reason
    assert "--remote-workers" in verdict.line()
    busy = {**record, "learner_wait_frac": 0.05, "learner_train_frac": 0.9, "remote_wait_slot_frac": 0.9}
    assert classify(busy).kind == "training"
