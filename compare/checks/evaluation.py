"""Both programs' evaluation of one TF1 checkpoint of the legacy program."""
from __future__ import annotations

import os

import numpy as np

from compare.report import judge, not_applicable, tensor_error
from compare.report import Result
from compare.interface import optional
from compare.sides import Sides


def check_evaluation(sides: Sides, train_steps: int = 3) -> Result:
    """The legacy program trains a few steps from the common start and saves every variable (its
    moving averages included) with the program's own Saver layout; the legacy evaluation
    (LegacySide.evaluate) and the modern one (ModernBuild.evaluate) read that one checkpoint, and
    each metric they report must agree."""
    name = f"{sides.label}evaluation (one checkpoint)"
    legacy, build = sides.legacy, sides.modern.build
    evaluate = optional(sides.pair.legacy, "evaluate")
    if "evaluation" not in sides.pair.capabilities or build.evaluate is None or evaluate is None:
        return not_applicable(name, sides.pair.name, "the adapter declares no evaluation (capability 'evaluation')")
    legacy.restore(sides.start)
    for k in range(train_steps):
        legacy.step(sides.batch(seed=400 + k))
    folder = os.path.join(sides.tmp_dir, f"{sides.pair.name}_eval")
    os.makedirs(folder, exist_ok=True)
    with legacy.graph.as_default():
        path = legacy.full_saver.save(legacy.sess, os.path.join(folder, "model.ckpt"), global_step=train_steps)
    metrics_l = dict(evaluate(legacy.flags, path, sides.files))
    metrics_m = dict(build.evaluate(path))
    keys = sorted(set(metrics_l) & set(metrics_m))
    errors = [tensor_error(k, np.float64(metrics_l[k]), np.float64(metrics_m[k])) for k in keys]
    only = sorted(set(metrics_l) ^ set(metrics_m))
    return judge(name, sides.pair.name, errors, sides.tol.model, ok=None if not only else False,
                 note=f"after {train_steps} legacy steps: " + ", ".join(
                     f"{k} legacy {metrics_l[k]:.4g} / modern {metrics_m[k]:.4g}" for k in keys)
                 + (f"; reported by one side only: {only}" if only else ""))
