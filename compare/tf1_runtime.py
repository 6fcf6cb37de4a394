"""A pair's legacy graph on TF1's own runtime, in a process of its own, for the parity harness.

The originals ran on TF 1.x: ref variables, v1 control flow (Switch/Merge), graph mode only.
`tf.compat.v1.disable_v2_behavior()` gets that runtime back, process-wide (it turns eager execution
off), so the modern program cannot run beside it.  `compare/checks/tf1.py` therefore writes one
batch, the dropout masks the modern step drew, the start checkpoint and the adapter's name to a
file (with the arguments the pairing gave both programs), runs

    python -m compare.tf1_runtime IN.npz OUT.npz

and compares what this process writes back: the program's loss and averaged gradients, and the
moving statistics after one training step (run `repeats` times from the same state, each run its own
interleaving of the towers' updates), with the batch statistics each tower's update read.  The graph is
built by the adapter's own LegacySide.build (compare.legacy_run.LegacyRun), as in the harness's process.
"""
import json
import sys


import numpy as np
import tensorflow.compat.v1 as tf


def main(in_path: str, out_path: str) -> None:
    tf.disable_v2_behavior()  # before any graph: the whole process on TF1's runtime
    tf.get_logger().setLevel("ERROR")
    import warnings
    warnings.filterwarnings("ignore", message="`layer.apply` is deprecated", category=UserWarning)
    from compare import common, harness
    from compare.interface import Batch
    from compare.legacy_run import LegacyRun

    common.blas_on_one_thread()
    data = np.load(in_path, allow_pickle=True)
    meta = json.loads(str(data["meta"]))
    from compare import limits
    limits.configure(float(meta.get("seconds", limits.SECONDS)), enforce=True)  # each phase as in the harness's
    pair = harness.reload_pair(meta["adapter"], meta.get("programs", {}))
    pairing = next(p for p in pair.pairings if p.label == meta["pairing"])
    towers = int(meta["towers"])
    flags = pair.legacy.parse_args([pair.legacy.tower_flag, str(towers), *meta["argv"], *pairing.legacy_argv])
    legacy = LegacyRun(pair, flags, towers, meta["files"], int(meta["seed"]))
    with legacy.graph.as_default():
        legacy.saver.restore(legacy.sess, meta["start"])
    batch = Batch(data["x"], data["y"])
    masks = [list(data[f"mask:{k}"]) for k in range(int(meta["dropouts"]))] or None
    first = legacy.gradients(batch, masks)
    loss, grads = first.loss, first.gradients
    moving = sorted({u.variable.op.name for u in legacy.moving})
    start = legacy.state()
    repeats = int(meta.get("repeats", 1))
    out = {"loss": loss, "variable_class": type(legacy.by_name[legacy.trainable[0]]).__name__,
           "updates": json.dumps([[u.variable.op.name, u.tower] for u in legacy.moving]), "repeats": repeats}
    out.update({f"grad:{n}": g for n, g in grads.items()})
    out.update({f"before:{n}": start.weights[n] for n in moving})
    for r in range(repeats):  # the same step again from the same state: each run its own interleaving
        legacy.restore(start, powers=False)
        stats = legacy.step(batch, masks).stats
        after = legacy.read(moving)
        out.update({f"after:{r}:{n}": v for n, v in after.items()})
        out.update({f"stat:{r}:{i}": s for i, s in enumerate(stats)})
    np.savez(out_path, **out)  # type: ignore[arg-type]  # numpy's stubs: values of every array-like kind
    legacy.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
