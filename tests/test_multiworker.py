"""Beyond one machine (`modern/cluster.py`, `modern/launch.py`, `compare/multiworker.py`): parity of
2 workers x 1 replica with 1 x 2 and with the legacy 2 towers, preemption (SIGTERM) and a killed
worker (SIGKILL) resumed without retraining a step, the launcher stopping every worker when one
fails, and the usage errors.

Every cluster runs on 127.0.0.1 ports the launcher picks free; every wait has a timeout.  MNIST only,
a few dozen steps.
"""
import glob
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from compare import multiworker
from compare.report import TOLERANCES
from conftest import ROOT, run_program
from modern import cluster
from modern.runtime import UsageError

STEPS = 60       # the planned final step is 59 (0-based, as modern/mnist_multi_gpu.py prints them)
SAVE_EVERY = 15


# ----------------------------------------------------------------------------------------------
# Parity, and the planted defect it must catch.
# ----------------------------------------------------------------------------------------------
def test_two_workers_train_like_two_replicas_and_the_legacy_towers_and_planted_defects_fail(tmp_path):
    good, legacy = multiworker.run(2, steps=5, work_dir=tmp_path / "good", log=lambda m: None)
    assert good.status == "PASS", good.as_dict()
    assert good.worst.rel_l2 <= TOLERANCES["mlp_steps"][0]
    losses = good.extra["losses"]
    assert all(math.isfinite(x) for x in losses["reference"]) and losses["workers"][0] == losses["workers"][1]
    # The legacy towers on the even steps (2 and 4 are short: 15 rows and 1 row over 2 towers).
    assert legacy.status == "PASS", legacy.as_dict()
    assert legacy.extra["compared_steps"] == [0, 1, 3]
    assert len(legacy.errors) == 2 * 3 * (1 + 4 + 4)  # workers x steps x (loss, 4 gradients, 4 weights)
    # Planted on the legacy side (tower 1's images one row off their labels), on the same recorded steps.
    shifted = multiworker.check_legacy_towers(str(tmp_path / "good"), 2, 5, defect="shift_tower_rows")
    assert shifted.status == "FAIL", shifted.as_dict()
    # Planted in the cluster: the workers' input not sharded.
    [bad] = multiworker.run(2, steps=5, tmp_dir=tmp_path, log=lambda m: None, defect="repeat_rows", legacy=False)
    assert bad.status == "FAIL", bad.as_dict()


# ----------------------------------------------------------------------------------------------
# Preemption and a killed worker: one folder, three cluster runs.
# ----------------------------------------------------------------------------------------------
def _run_cluster(model_dir, tmp, kill=None, timeout=180):
    """Launch 2 MNIST workers; kill = (signal, worker, first step at which to send it) or None.

    Returns (launcher exit code, all output lines, worker 0's trained steps, worker pids)."""
    env = dict(os.environ, TMPDIR=str(tmp))
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "modern.launch", "--workers", "2", "--grace", "5", "--",
               "modern/mnist_multi_gpu.py", "--training_steps", str(STEPS), "--save_every", str(SAVE_EVERY),
               "--log_every", "1", "--batch_size", "20", "--deterministic", "--model_save_path", str(model_dir)]
    p = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, p.kill)  # bounded, whatever happens
    timer.start()
    lines, steps, pids, sent = [], [], {}, False
    try:
        for line in p.stdout:
            lines.append(line)
            if m := re.match(r"\[launch\] worker (\d): pid (\d+)", line):
                pids[int(m[1])] = int(m[2])
            if m := re.match(r"\[worker 0\] .*: step (\d+), loss", line):
                steps.append(int(m[1]))
                if kill and not sent and steps[-1] >= kill[2]:
                    os.kill(pids[kill[1]], kill[0])
                    sent = True
        p.wait(timeout=30)
    finally:
        timer.cancel()
    return p.returncode, lines, steps, pids


def _latest_number(model_dir):
    return int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_sigterm_and_sigkill_resume_without_retraining_a_step(tmp_path):
    model_dir, tmp = tmp_path / "model", tmp_path / "tmp"
    tmp.mkdir()
    # 1. SIGTERM to worker 1 after the first periodic checkpoint: every worker saves, exits 42.
    code, lines, steps1, pids = _run_cluster(model_dir, tmp, kill=(signal.SIGTERM, 1, SAVE_EVERY + 3))
    text = "".join(lines)
    assert code == cluster.PREEMPTED_EXIT_CODE, text[-3000:]
    saved = int(re.search(r"\[worker 0\] preemption: checkpoint .*model\.ckpt-(\d+) saved", text)[1])
    assert saved >= SAVE_EVERY + 3 and saved == _latest_number(model_dir) and saved < STEPS - 1
    assert all(_gone(pid) for pid in pids.values())
    assert not glob.glob(str(tmp / "worker1-*")), "worker 1's temporary folder was left behind"
    # 2. Restart; SIGKILL worker 1 a few steps after the next periodic checkpoint.
    next_save = (saved // SAVE_EVERY + 1) * SAVE_EVERY
    code, lines, steps2, pids = _run_cluster(model_dir, tmp, kill=(signal.SIGKILL, 1, next_save + 3))
    text = "".join(lines)
    assert code == 1 and "worker 1 was killed by SIGKILL" in text, text[-3000:]  # the launcher names it
    assert f"model.ckpt-{saved}: step {saved + 1}" in text  # resumed at the step after the checkpoint
    assert min(steps2) == saved + 1, "a step before the checkpoint was trained again"
    assert all(_gone(pid) for pid in pids.values())
    killed_at = _latest_number(model_dir)
    assert killed_at >= next_save
    # 3. Restart: ends at the planned final step.
    code, lines, steps3, _ = _run_cluster(model_dir, tmp)
    text = "".join(lines)
    assert code == 0, text[-3000:]
    assert min(steps3) == killed_at + 1 and max(steps3) == STEPS - 1
    last_loss = float(re.search(r"\[worker 0\] Ended: .* \(through step (\d+)\) .*last loss ([-\w.]+)",
                                text)[2].rstrip("."))
    assert math.isfinite(last_loss)
    assert f"After {STEPS} training step(s)" in text
    # Checkpoints and event files intact: every one listed reads back, every event record parses.
    state = tf.train.get_checkpoint_state(str(model_dir))
    assert state.model_checkpoint_path.endswith(f"model.ckpt-{STEPS - 1}")
    for path in state.all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(path)
        tensors = [reader.get_tensor(name) for name, _ in tf.train.list_variables(path)]
        floats = [t for t in tensors if np.asarray(t).dtype.kind == "f"]
        assert len(floats) >= 4 and all(np.all(np.isfinite(t)) for t in floats)
    loss_steps = []
    for events in glob.glob(str(model_dir / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(events):
            loss_steps += [event.step for v in event.summary.value if v.tag == "loss"]
    assert max(loss_steps) == STEPS - 1
    with open(model_dir / cluster.LAYOUT_FILE) as f:
        assert json.load(f) == {"workers": 2, "replicas_per_worker": 1}


def _cluster_losses(model_dir, *args):
    """{step: loss} worker 0 printed, in a 2-worker MNIST run of `args` in model_dir."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-m", "modern.launch", "--workers", "2", "--grace", "5", "--",
                           "modern/mnist_multi_gpu.py", "--log_every", "1", "--batch_size", "20",
                           "--model_save_path", str(model_dir), *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    return {int(m[1]): m[2] for m in re.finditer(r"\[worker 0\] .*: step (\d+), loss = ([-\w.]+)", done.stdout)}


def test_a_resumed_cluster_without_seed_sees_the_batches_of_an_uninterrupted_run(tmp_path):
    """The chief's shuffle seed (an unseeded draw) travels in the checkpoint: a copy of an
    uninterrupted unseeded run, cut back to its step-10 checkpoint and resumed (no --seed), trains
    steps 11..29 with the uninterrupted run's losses; a fresh draw would shuffle other batches."""
    import shutil
    whole_dir, resumed_dir = tmp_path / "whole", tmp_path / "resumed"
    whole = _cluster_losses(whole_dir, "--training_steps", 30, "--save_every", 10)
    shutil.copytree(whole_dir, resumed_dir)
    tf.compat.v1.train.update_checkpoint_state(str(resumed_dir), str(resumed_dir / "model.ckpt-10"))
    resumed = _cluster_losses(resumed_dir, "--training_steps", 30)
    assert sorted(resumed) == list(range(11, 30))
    assert resumed == {step: whole[step] for step in range(11, 30)}
    seeds = [tf.train.load_checkpoint(str(d)).get_tensor("shuffle_seed/.ATTRIBUTES/VARIABLE_VALUE")
             for d in (whole_dir, resumed_dir)]
    assert seeds[0] == seeds[1] and 0 <= int(seeds[0]) < 2 ** 31


# ----------------------------------------------------------------------------------------------
# The launcher, and bad input.
# ----------------------------------------------------------------------------------------------
def test_launcher_stops_every_worker_when_one_fails_at_start():
    program = ("import json, os, sys, time; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
               "print('up', flush=True); time.sleep(60) if i == 0 else sys.exit(3)")
    start = time.time()
    done = run_program(["-m", "modern.launch", "--workers", "2", "--grace", "2", "--", "-c", program], timeout=60)
    assert done.returncode == 1
    assert "[launch] worker 1 exited with code 3; stopping the other workers" in done.stdout
    assert "[worker 0] up" in done.stdout and time.time() - start < 30
    pids = [int(p) for p in re.findall(r"pid (\d+)", done.stdout)]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


def test_a_worker_whose_peer_never_comes_gives_up_after_connect_timeout(tmp_path):
    """The chief alone (worker 1 never starts): one error line naming the missing worker, exit 2,
    no traceback, within the timeout plus TensorFlow's start-up; nothing written."""
    import socket
    with socket.socket() as a, socket.socket() as b:  # two free ports, released before the run
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": addresses},
                                                 "task": {"type": "worker", "index": 0}}))
    start = time.time()
    done = subprocess.run([sys.executable, "modern/mnist_multi_gpu.py", "--num_replicas", "1", "--connect_timeout", "3",
                           "--model_save_path", str(tmp_path / "model")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 2, done.stderr[-3000:]
    assert (f"error: worker 0 ({addresses[0]}) could not reach worker 1 ({addresses[1]}) within "
            f"--connect_timeout 3 s") in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert time.time() - start < 40
    assert not (tmp_path / "model").exists() or not os.listdir(tmp_path / "model")


def test_a_lost_peer_is_named_with_the_way_back(tmp_path):
    """The paragraph a survivor prints (the error a SIGKILL of worker 1 produces)."""
    worker = cluster.Worker(["127.0.0.1:1111", "127.0.0.1:2222"], 0, 1)
    error = tf.errors.UnavailableError(None, None, (
        "Graph execution error:\n\nCollective ops is aborted by: recvmsg:Connection reset by peer\n"
        "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
        "/tensorflow.WorkerService/RecvBuf:\n"))
    guarded = cluster.reporting_lost_peers(worker, str(tmp_path), lambda: (_ for _ in ()).throw(error))
    with pytest.raises(cluster.PeerLostError) as raised:
        guarded()
    message = str(raised.value)
    assert message.startswith("worker 0 (127.0.0.1:1111) lost worker 1 (127.0.0.1:2222) mid-run "
                              "(UnavailableError: Collective ops is aborted by: recvmsg:Connection reset by peer)")
    assert "none yet" in message and "start the whole cluster again" in message
    assert isinstance(raised.value, UsageError)  # exit code 2, one paragraph, no traceback
    assert cluster.reporting_lost_peers(None, str(tmp_path), len) is len  # one host: untouched


@pytest.mark.parametrize("config, problem", [
    ("{not json", "not valid JSON"),
    ('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 2}}',
     "index 2 is out of range for 2 workers"),
    ('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}',
     "lists worker 127.0.0.1:1 twice"),
    ('{"cluster": {"worker": ["127.0.0.1"]}, "task": {"type": "worker", "index": 0}}', "is not host:port"),
])
def test_a_malformed_tf_config_is_named(config, problem):
    with pytest.raises(UsageError, match=re.escape(problem)):
        cluster.read_tf_config({"TF_CONFIG": config})


def test_a_port_in_use_and_replicas_on_cpu_workers_are_usage_errors(monkeypatch):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} is in use"):
            cluster._check_port_free(f"127.0.0.1:{port}")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    with pytest.raises(UsageError, match="one replica per CPU worker"):
        cluster.make_strategy(2, log=None)


def test_a_checkpoint_of_another_layout_is_refused_untouched(tmp_path):
    tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(tmp_path / "ckpt"))
    before = sorted(os.listdir(tmp_path))
    two_workers = cluster.Worker(["127.0.0.1:1", "127.0.0.1:2"], 0, 1)
    with pytest.raises(UsageError, match="written on one host"):
        cluster.check_layout(str(tmp_path), two_workers, 1)
    (tmp_path / cluster.LAYOUT_FILE).write_text(json.dumps({"workers": 3, "replicas_per_worker": 1}))
    with pytest.raises(UsageError, match=r"written by 3 worker\(s\) x 1 replica\(s\); this run is 2 x 1"):
        cluster.check_layout(str(tmp_path), two_workers, 1)
    with pytest.raises(UsageError, match=r"3 worker\(s\)"):  # and a one-host run will not take it either
        cluster.check_layout(str(tmp_path), None, 2)
    assert sorted(os.listdir(tmp_path)) == sorted(before + [cluster.LAYOUT_FILE])
