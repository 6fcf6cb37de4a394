"""legacy/estimator_compat.py: the released tensorflow-estimator 2.15.0 imports and trains on TF 2.21.

A model_fn is trained and evaluated in this process (the Estimator builds its own graphs), plainly and
under a MirroredStrategy of the two virtual CPU devices the test processes have; the paths the
compatibility module cannot serve (the distribute coordinator's multi-worker modes, TPU embedding)
each raise one line.
"""
import json

import numpy as np
import pytest
import tensorflow as tf

from legacy import estimator_compat

tf1 = tf.compat.v1


def input_fn():
    x = np.random.RandomState(0).randn(64, 4).astype(np.float32)
    y = (x.sum(1) > 0).astype(np.int32)
    return tf1.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)


def model_fn(features, labels, mode):
    logits = tf1.layers.dense(features, 2, name="logits")
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf1.train.GradientDescentOptimizer(0.5).minimize(loss, tf1.train.get_or_create_global_step())
    return estimator_compat.v1().EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops={
        "accuracy": tf1.metrics.accuracy(labels, tf.argmax(logits, 1))})


@pytest.mark.parametrize("mirrored", [False, True], ids=["plain", "mirrored"])
def test_an_estimator_trains_and_evaluates_a_model_fn(tmp_path, mirrored):
    est = estimator_compat.v1()
    strategy = tf1.distribute.MirroredStrategy(devices=["/cpu:0", "/cpu:1"]) if mirrored else None
    config = est.RunConfig(train_distribute=strategy, session_config=tf1.ConfigProto(device_count={"CPU": 2}))
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path), config=config)
    estimator.train(input_fn, steps=30)
    results = estimator.evaluate(input_fn, steps=4)
    assert results["global_step"] == 30
    assert np.isfinite(results["loss"]) and results["loss"] < 0.6, results  # ln 2 = 0.69 at the start
    assert results["accuracy"] > 0.8, results
    names = [name for name, _ in tf.train.list_variables(str(tmp_path))]
    assert "logits/kernel" in names and not any("replica_1" in n for n in names)  # a mirrored variable saved once


def test_the_estimator_api_name_is_known_to_tf_export():
    from tensorflow.python.util import tf_export
    assert estimator_compat.register_estimator_api() is False  # already registered by the import: idempotent
    assert tf_export.API_ATTRS["estimator"].names == "_estimator_api_names"
    assert "estimator.Estimator" in estimator_compat.v1().Estimator._estimator_api_names_v1
    assert estimator_compat.v1().RunConfig._estimator_api_names == ("estimator.RunConfig",)


def test_a_tf_config_cluster_of_workers_is_refused_in_one_line(monkeypatch):
    """The distribute coordinator's INDEPENDENT_WORKER mode: gone with TF 2.16, named, one line."""
    est = estimator_compat.v1()
    cluster = {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    with pytest.raises(estimator_compat.EstimatorUnavailable) as raised:
        est.RunConfig(train_distribute=tf1.distribute.MirroredStrategy(devices=["/cpu:0"]))
    assert "INDEPENDENT_WORKER" in str(raised.value) and "\n" not in str(raised.value)
    # With a master job, TF 1.x did not use the coordinator either: the settings come from TF_CONFIG.
    cluster["cluster"]["master"] = ["localhost:0"]
    cluster["task"] = {"type": "master", "index": 0}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    config = est.RunConfig(train_distribute=tf1.distribute.MirroredStrategy(devices=["/cpu:0"]))
    assert config.task_type == "master" and config._distribute_coordinator_mode is None


def test_the_tpu_modules_tensorflow_removed_import_and_refuse_when_used():
    from tensorflow.python.tpu import tpu_embedding
    with pytest.raises(estimator_compat.EstimatorUnavailable, match="tpu_embedding.AdagradParameters is gone since"):
        tpu_embedding.AdagradParameters(0.1)
    assert isinstance(tpu_embedding.FeatureConfig, type)  # isinstance checks against it still work
