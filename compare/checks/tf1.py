"""The legacy graph on TF1's own runtime (ref variables, v1 control flow), in a process of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from compare.checks.forward import gradient_errors
from compare.checks.steps import predictions_legacy, _SCHEDULES, schedules
from compare.report import judge, tensor_error


def check_tf1_runtime(sides, settings):
    """The legacy graph built by the adapter after `disable_v2_behavior()` (compare/tf1_runtime.py),
    from the start checkpoint, with the masks the modern step drew: its loss and gradients against
    the modern step's (PASS), and one step's moving statistics against the unordered-update
    predictions (EXPECTED: with ref variables the towers' assign_sub ops on one shared variable are
    unordered and unlocked, so each element may see its own schedule)."""
    name = f"{sides.label}legacy on TF1's runtime"
    batch = sides.batch(seed=3)
    sides.set_both(sides.start)
    step = sides.modern.step(batch, before=sides.start)
    _, feed = sides.legacy.feed(batch, True)
    masks = sides.tower_masks(batch, feed.rows, step["masks"], step["replicas"]) or []
    in_path = os.path.join(sides.tmp_dir, f"{sides.pair.name}_tf1_in.npz")
    out_path = os.path.join(sides.tmp_dir, f"{sides.pair.name}_tf1_out.npz")
    meta = {"adapter": sides.pair.module, "pairing": sides.pairing.label, "towers": sides.towers,
            "seed": sides.seed, "start": sides.start_path, "files": dict(sides.files), "dropouts": len(masks)}
    arrays = {f"mask:{k}": np.array(per_tower, dtype=object) for k, per_tower in enumerate(masks)}
    np.savez(in_path, x=batch.x, y=batch.y, meta=json.dumps(meta), **arrays)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "compare.tf1_runtime", in_path, out_path], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return [judge(name, sides.pair.name, [], sides.tolerances["model"], ok=False,
                      note=f"compare/tf1_runtime.py failed: {tail}")]
    out = np.load(out_path, allow_pickle=True)
    grads = {k[5:]: out[k] for k in out.files if k.startswith("grad:")}
    errors = [tensor_error("loss", out["loss"], step["loss"])] + gradient_errors(sides, grads, step["gradients"])
    results = [judge(f"{name}: loss and gradients", sides.pair.name, errors, sides.tolerances["model"],
                     note=f"{len(grads)} gradients, the legacy graph on TF1's runtime ({out['variable_class']}) "
                          f"vs the modern train step")]
    updates = json.loads(str(out["updates"]))
    if updates:
        results.append(moving_on_ref_variables(sides, out, updates))
    return results


def moving_on_ref_variables(sides, out, updates):
    tol = sides.tolerances["model"].rel_l2
    groups = {}
    for i, (var, tower) in enumerate(updates):
        groups.setdefault(var, []).append((tower or 0, i))
    feed, _ = sides.legacy.feed(sides.batch(seed=1), True)
    first = {u.variable.op.name: u for u in reversed(sides.legacy.moving)}
    errors, whole, gaps = [], 0, []
    n = max(len(v) for v in groups.values())
    for var, members in sorted(groups.items()):
        decay = 1 - float(sides.legacy.sess.run(first[var].one_minus_decay, feed))
        v = out[f"before:{var}"].astype(np.float64)
        a = [out[f"stat:{i}"].astype(np.float64) for _, i in sorted(members)]
        preds = np.stack(predictions_legacy(v, a, decay))
        after = out[f"after:{var}"]
        floor = ((len(a) + 1) * np.linalg.norm(np.spacing(np.abs(out[f"before:{var}"])))
                 + 4 * (1 - decay) * sum(np.linalg.norm(np.spacing(np.abs(s.astype(np.float32)))) for s in a)) / tol
        scores = [tensor_error("", after - v, p - v, floor).rel_l2 for p in preds]
        if min(scores) <= tol:
            whole += 1
            best = preds[int(np.argmin(scores))]
        else:  # ref variables: the towers' unlocked read-modify-writes may interleave element by element
            best = np.take_along_axis(preds, np.argmin(np.abs(preds - after), axis=0)[None], axis=0)[0]
        errors.append(tensor_error(var, after - v, best - v, floor))
        gaps.append(tensor_error("", v - (v - np.mean(a, axis=0)) * (1 - decay) - v, best - v, floor).rel_l2)
    if n not in _SCHEDULES:
        _SCHEDULES[n] = schedules(n)
    distinct = n == 1 or min(gaps) > tol
    return judge(f"{sides.label}legacy on TF1's runtime: bn moving statistics", sides.pair.name, errors,
                 sides.tolerances["model"], expected=n > 1, ok=distinct and all(e.rel_l2 <= tol for e in errors),
                 note=f"{len(errors)} moving statistics after one step: {whole} match one of the {len(_SCHEDULES[n])} "
                      f"schedules of {n} unordered ref-variable updates as a whole, {len(errors) - whole} element by "
                      f"element" + (f"; a single mean update is off by >= {min(gaps):.2g}" if n > 1 else ""))
