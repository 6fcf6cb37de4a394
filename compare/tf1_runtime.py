"""The legacy CIFAR graph on TF1's own runtime, in a process of its own, for the parity harness.

The originals ran on TF 1.x: ref variables, v1 control flow (Switch/Merge), graph mode only.
`python legacy/cifar_resnet.py --tf1_behavior` gets that runtime back with
`tf.compat.v1.disable_v2_behavior()`, which is process-wide (it turns eager execution off), so the
modern program cannot run beside it.  `compare/cifar.py` (`check_tf1_runtime`) therefore writes one
batch, the dropout masks the modern step drew and the start checkpoint's path to a file, runs

    python -m compare.tf1_runtime IN.npz OUT.npz

and compares what this process writes back: the program's loss and averaged gradients, and one
training step's moving statistics with each tower's batch statistics.
"""
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402


def batch_stats_v1(graph, num_towers):
    """{(tower, TF1 BN scope): (batch mean, Bessel variance)}: with v1 control flow slim's fused
    batch norm is a FusedBatchNormV3 op inside a `cond`; its outputs 1 and 2 leave the cond
    through a `Merge` (ops inside a v1 cond cannot be fetched)."""
    stats = {}
    for op in graph.get_operations():
        if op.type != "FusedBatchNormV3" or not op.get_attr("is_training"):
            continue
        head, rest = op.name.split("/", 1)
        tower = int(head.rsplit("_", 1)[1]) if head != "resnet_v2_50" else 0
        scope = "resnet_v2_50/" + rest.split("/cond/")[0]
        stats[(tower, scope)] = (_merged(op.outputs[1]), _merged(op.outputs[2]))
    if len(stats) != 49 * num_towers:
        raise RuntimeError(f"found {len(stats)} training batch norms, expected {49 * num_towers}")
    return stats


def _merged(tensor):
    seen = tensor
    for _ in range(4):
        merges = [c for c in seen.consumers() if c.type == "Merge"]
        if merges:
            return merges[0].outputs[0]
        seen = next(c for c in seen.consumers() if c.type == "Identity").outputs[0]
    raise RuntimeError(f"no Merge after {tensor.name}")


def main(in_path, out_path):
    tf.disable_v2_behavior()  # as legacy/cifar_resnet.py --tf1_behavior, before any graph
    from legacy import cifar_resnet as legacy_cifar
    import tf_slim as slim

    data = np.load(in_path, allow_pickle=True)
    num_towers = int(data["towers"])
    args = legacy_cifar.parse_args(["--num_towers", str(num_towers), "--tf1_behavior"])
    with tf.Graph().as_default() as graph:
        ns = legacy_cifar.build_graph(num_towers, "fix", None, args.boundaries, args.values)
        variables = {v.op.name: v for v in slim.get_model_variables()}
        moving = {n: v for n, v in variables.items() if "/moving_" in n}
        stats = batch_stats_v1(graph, num_towers)
        saver = tf.train.Saver(var_list=variables)
        init = tf.global_variables_initializer()
        ref = type(variables["resnet_v2_50/conv1/weights"]).__name__
        with tf.Session(config=legacy_cifar.session_config(num_towers)) as sess:
            sess.run(init)
            saver.restore(sess, str(data["start"]))
            feed, _ = legacy_cifar.make_feed(ns, data["x"], data["y"], True, float(data["keep_prob"]))
            for i, mask in enumerate(data["masks"]):
                feed[ns.dropout_noise[i]] = mask
            loss, grads = sess.run([ns.total_loss, [g for g, _ in ns.grads]], feed)
            before = sess.run(moving)
            stat_values, _ = sess.run([stats, ns.train_step], feed)
            after = sess.run(moving)
    out = {"loss": loss, "variable_class": ref}
    out.update({f"grad:{v.op.name}": g for g, (_, v) in zip(grads, ns.grads)})
    out.update({f"before:{n}": v for n, v in before.items()})
    out.update({f"after:{n}": v for n, v in after.items()})
    for (tower, scope), (mean, variance) in stat_values.items():
        out[f"mean:{tower}:{scope}"], out[f"variance:{tower}:{scope}"] = mean, variance
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
