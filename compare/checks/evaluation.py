"""Both programs' evaluation of one TF1 checkpoint of the legacy program."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from compare import tf1_graph

from compare.report import judge, not_applicable, tensor_error
from compare.report import Result
from compare.report import TensorError
from compare.interface import optional, undeclared
from compare.sides import Sides


def check_evaluation(sides: Sides, train_steps: int = 3) -> Result:
    """The legacy program trains a few steps from the common start and saves every variable (its
    moving averages included) with the program's own Saver layout; the legacy evaluation
    (LegacySide.evaluate) and the modern one (ModernBuild.evaluate) read that one checkpoint, and
    each metric they report must agree.  NOT APPLICABLE where the metrics have no power: the legacy
    evaluation of the same checkpoint with its logits layer rolled by one class (every prediction
    moved to the next class) gives the same metrics (a model at chance level)."""
    name = f"{sides.label}evaluation (one checkpoint)"
    legacy, build = sides.legacy, sides.modern.build
    evaluate = optional(sides.pair.legacy, "evaluate")
    if "evaluation" not in sides.pair.capabilities or build.evaluate is None or evaluate is None:
        return not_applicable(name, sides.pair.name, undeclared(sides.pair, "evaluation", "evaluation"))
    legacy.restore(sides.start)
    for k in range(train_steps):
        legacy.step(sides.batch(seed=400 + k))
    folder = os.path.join(sides.tmp_dir, f"{sides.pair.name}_eval")
    os.makedirs(folder, exist_ok=True)
    with legacy.graph.as_default():
        path = legacy.full_saver.save(legacy.sess, os.path.join(folder, "model.ckpt"), global_step=train_steps)
    runs = [dict(evaluate(legacy.flags, path, sides.files)) for _ in range(2)]
    if runs[0] != runs[1]:  # not deterministic (threaded readers): measure its spread
        runs += [dict(evaluate(legacy.flags, path, sides.files)) for _ in range(REPEATS - 2)]
    rolled = rolled_checkpoint(sides, os.path.join(folder, "rolled.ckpt"), train_steps)
    if rolled is not None:
        probe = dict(evaluate(legacy.flags, rolled, sides.files))
        same = [k for k in runs[0] if k in probe and min(r[k] for r in runs) <= probe[k] <= max(r[k] for r in runs)]
        if same and len(same) == len(runs[0]):
            return not_applicable(name, sides.pair.name, "the metrics cannot tell this checkpoint from one that "
                                  "predicts every row's next class (its logits layer's columns rolled by one): "
                                  + ", ".join(f"{k} {runs[0][k]:.4g} for both" for k in same)
                                  + "; the model is at chance level on these rows, and nothing would be judged")
    metrics_m = dict(build.evaluate(path))
    keys = sorted(set(runs[0]) & set(metrics_m))
    errors = [within_spread(k, [r[k] for r in runs], metrics_m[k], sides.tol.model.rel_l2) for k in keys]
    only = sorted(set(runs[0]) ^ set(metrics_m))
    spread = (f"; the legacy evaluation is not deterministic: {len(runs)} runs of one checkpoint gave "
              + ", ".join(f"{k} {min(r[k] for r in runs):.4g} to {max(r[k] for r in runs):.4g}" for k in keys)
              + ", the modern one judged against that range" if runs[0] != runs[1] else "")
    power = ("; a checkpoint predicting every row's next class gives " + ", ".join(
        f"{k} {probe[k]:.4g}" for k in keys if k in probe) if rolled is not None else
        "; no dense logits layer found to probe the metrics' power with")
    return judge(name, sides.pair.name, errors, sides.tol.model, ok=None if not only else False,
                 note=f"after {train_steps} legacy steps: " + ", ".join(
                     f"{k} legacy {runs[0][k]:.4g} / modern {metrics_m[k]:.4g}" for k in keys) + spread
                 + power + (f"; reported by one side only: {only}" if only else ""))


def rolled_checkpoint(sides: Sides, path: str, step: int) -> Optional[str]:
    """The legacy program's current variables saved at `path` with its logits layer's kernel columns
    and bias (and their moving averages) rolled by one class: a model that predicts every row's next
    class.  None where the logits are not a dense layer the graph shows."""
    legacy = sides.legacy
    layer = tf1_graph.logits_layer(legacy.lg.tower_logits[0], legacy.by_name)
    if layer is None:
        return None
    names = [*layer, *(legacy.shadows[n].op.name for n in layer if n in legacy.shadows)]
    before = legacy.read(names)
    legacy.assign({n: np.roll(v, 1, axis=-1) for n, v in before.items()})
    try:
        with legacy.graph.as_default():
            return legacy.full_saver.save(legacy.sess, path, global_step=step)
    finally:
        legacy.assign(before)


REPEATS = 5  # runs of a legacy evaluation that does not give the same metrics twice


def within_spread(key: str, legacy: list[float], modern: float, tolerance: float) -> TensorError:
    """The modern metric against the legacy one, or, where the legacy runs spread, against the nearest
    end of their range (0 inside it)."""
    low, high = min(legacy), max(legacy)
    nearest = min(max(modern, low), high)
    return tensor_error(key, np.float64(nearest), np.float64(modern))
