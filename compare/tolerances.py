"""Tolerances derived for one pair, from its model and from floors measured in the same run.

No tolerance here is a constant tuned for a model.  Each is computed when a pairing is set up, on
the legacy program (the reference), from the model's own sensitivity to the smallest change float32
can make and from the spread of its own computation repeated:

  1-ulp input  the legacy towers' logits (inference mode, the program's validation feed) and its
               training loss, from the harness's rows and from the same rows moved by one float32
               ulp: how far a forward pass of this model carries a round-off-sized change.  A port
               that computes the same function in another order, or by an equivalent formula, differs
               by about this much.  (Inference mode: training-mode batch norm over a tower's few rows
               is chaotic, its sensitivity measures the batch statistics' conditioning, not round-off.)
  repeat       the legacy program's loss, logits and every gradient computed twice from the same
               state (thread order in the reductions; 0 on a CPU, not always on a GPU).  Per gradient
               it is also a floor of that tensor's comparison: a tensor may differ by MARGIN times its
               own repeat spread.
  eps32        one rounding.

Randomness is imposed before anything is measured: the dropouts the logits and the loss run are fed one
fixed seeded draw of their noise (`fixed_masks`), in inference mode too where a dropout is on there
(`Sides.always_on`: a network built with is_training=True has no inference mode).

    model  = MARGIN x max(1-ulp input sensitivity of the logits and of the loss, repeat, eps32):
             forward passes, gradients, splits, one training step, moving statistics, evaluation
    steps  = K x model:  K free-running steps of a model that is not chaotic compound one step's error
             (a chaotic one is judged against its chaos floor, the legacy program against itself
             started 1 ulp away: the "chaos" check)

A derived tolerance has to leave a check its power: a model tolerance above POWER_BOUND (1e-3, the
size of a realistic mistake that shows only in the gradients, such as the regularisation added on
every replica instead of once) would PASS such a mistake.  It says that the legacy program's own
computation is not reproducible from what the harness feeds it (a random op it does not let the
harness impose, such as a dropout that is on whatever is fed), so the pair is not judged at that
level: `power` is a FAIL line, first in the pairing's report, naming the random ops the legacy
logits depend on and the spread they make, and the run exits 1.

For scale every report also prints the a-priori estimate 2 eps32 sum_l sqrt(fan_in_l) (a forward and
backward pass through L layers of dot products of fan_in_l terms with independent roundings).  The
1-ulp sensitivity to the WEIGHTS is no round-off measure: in training mode, batch norm over a tower's
few rows carries a one-ulp change of every weight to percents of some gradients, far above the two programs'
agreement; the free-running check measures that chaos.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from compare import tf1_graph
from compare.interface import Batch
from compare.measures import grad_errors
from compare.report import EPS32, MARGIN, Result, TensorError, Tolerance, Tolerances, judge, tensor_error
from compare.sides import Sides
from compare.state import Masks

__all__ = ["MARGIN", "POWER_BOUND", "Tolerances", "derive", "fan_in_estimate", "fixed_masks", "power",
           "row_order_tolerances"]

POWER_BOUND = Tolerance("power bound", 1e-3, "the largest model tolerance a pair is judged at: a mistake that moves "
                                             "only the gradients by 1e-3 relative must FAIL")
# The ops that draw random numbers: upstream of what a check compares, each must be imposed alike on
# both sides (fed, or seeded), or the legacy program disagrees with itself.
RANDOM_OPS = ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "Multinomial",
              "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "ParameterizedTruncatedNormal",
              "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessTruncatedNormalV2")

def fan_in_estimate(fan_ins: Sequence[int]) -> float:
    return 2 * EPS32 * sum(math.sqrt(k) for k in fan_ins)


def logits(sides: Sides, batch: Batch, masks: Masks) -> list[np.ndarray]:
    """The towers' logits in inference mode, with `masks` imposed on a dropout that is on there too."""
    return sides.legacy.inference_logits(batch, masks)[0]


def worst_rel(a_list: Sequence[Any], b_list: Sequence[Any]) -> float:
    return max((tensor_error("", a, b).rel_l2 for a, b in zip(a_list, b_list) if np.size(b)), default=0.0)


def derive(sides: Sides, steps: int) -> Tolerances:
    """The Tolerances of one built pairing, measured on its legacy side from the common start: the
    model tolerance, K steps' worth of it, and the per-gradient repeat spread."""
    legacy = sides.legacy
    batch = sides.batch(seed=97)
    moved = Batch(np.nextafter(batch.x, np.float32(np.inf)) if np.issubdtype(batch.x.dtype, np.floating)
                  else batch.x, batch.y)
    legacy.restore(sides.start)
    masks, inference_masks = fixed_masks(sides, batch), fixed_masks(sides, batch, training=False)
    out_a, out_b, out_m = (logits(sides, b, inference_masks) for b in (batch, batch, moved))
    first, again = legacy.gradients(batch, masks), legacy.gradients(batch, masks)
    loss_a, grads_a, loss_b, grads_b = first.loss, first.gradients, again.loss, again.gradients
    loss_m = float(legacy.run(legacy.lg.loss, moved, True, masks))
    s_logits = worst_rel(out_m, out_a)
    s_loss = tensor_error("", loss_m, loss_a).rel_l2
    repeat = max(worst_rel(out_b, out_a), tensor_error("", loss_b, loss_a).rel_l2)
    spread = {n: float(np.linalg.norm(np.subtract(grads_b[n], grads_a[n], dtype=np.float64))) for n in grads_a}
    model = MARGIN * max(s_logits, s_loss, repeat, EPS32)
    how = (f"{MARGIN} x max(1-ulp input sensitivity: logits {s_logits:.2g}, training loss {s_loss:.2g}; repeat "
           f"spread {repeat:.2g}; eps32); for scale: the fan-in estimate {fan_in_estimate(legacy.fan_ins):.2g} "
           f"({len(legacy.fan_ins)} layers)")
    return Tolerances(model=Tolerance("model", model, how),
                      steps=Tolerance("steps", steps * model, f"{steps} steps x model {model:.2g}"),
                      spread=spread, tensors=row_order_tolerances(sides, batch, masks, grads_a, model))


def random_ops(sides: Sides) -> list[str]:
    """The random ops tower 0's logits depend on in the legacy graph, as the program feeds them in
    inference mode (those the harness feeds, such as a dropout's noise it imposes, do not run; a
    dropout's noise at rate 0 runs and changes nothing)."""
    batch = sides.batch(seed=97)
    view = sides.legacy.inference_view(batch, fixed_masks(sides, batch, training=False))
    on = {d.noise.op for d in sides.legacy.dropouts_on(batch, False)}
    idle = {d.noise.op for d in sides.legacy.dropouts} - on
    return sorted(op.name for op in tf1_graph.running(view.tower_logits[:1], view.fed.feed_dict)
                  if op.type in RANDOM_OPS and op not in idle)


def power(sides: Sides) -> list[Result]:
    """[a FAIL line] where the pairing's model tolerance is above POWER_BOUND (the module docstring),
    else []: no check of the pairing would have power at that tolerance."""
    model = sides.tol.model
    if model.rel_l2 <= POWER_BOUND.rel_l2:
        return []
    ops = random_ops(sides)
    why = (f"the legacy logits depend on {len(ops)} random op(s) the harness does not impose "
           f"({', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''}); name or feed them" if ops
           else f"no random op upstream of the legacy logits was found: its forward pass itself is that sensitive "
                f"at {sides.pair.rows_per_tower} rows a tower (batch statistics over few rows are): judge it at more "
                f"rows a tower")
    return [judge(f"{sides.label}tolerances with power", sides.pair.name,
                  [TensorError("model tolerance", model.rel_l2, model.rel_l2, model.rel_l2)], POWER_BOUND,
                  note=f"the pair cannot be judged at this level: its model tolerance {model.rel_l2:.3g} "
                       f"({model.derivation}) is above {POWER_BOUND.rel_l2:g}, where a mistake that moves only the "
                       f"gradients by that much would PASS; {why} (docs/parity.md)")]


def reordered(sides: Sides, batch: Batch, masks: Masks) -> Optional[tuple[Batch, Masks]]:
    """`batch` with each tower's rows in reverse order (and their dropout masks with them): the same
    towers computing the same sums over their rows, in another order.  None where the towers' rows
    overlap without being the same rows (nothing to reorder alike on every tower)."""
    rows = [np.asarray(r, int) for r in sides.legacy.feed(batch, True).towers.rows]
    sets = {tuple(sorted(r.tolist())) for r in rows}
    if len(sets) > 1 and len({i for r in rows for i in r.tolist()}) != sum(len(r) for r in rows):
        return None
    order = np.arange(batch.rows)
    for r in rows:
        order[r] = r[::-1]
    flipped = None if masks is None else [[m[::-1] for m in per_tower] for per_tower in masks]
    return batch.take(order), flipped


def row_order_tolerances(sides: Sides, batch: Batch, masks: Masks, grads: Mapping[str, np.ndarray],
                         model: float) -> dict[str, Tolerance]:
    """Per gradient, where it exceeds the model tolerance: MARGIN times how far the legacy program's
    own gradient moves when each tower sums its rows in another order (`reordered`).  A gradient that
    sums many cancelling terms (a bias) moves far more than the logits; a port that sums the same rows
    in another order (one whole batch against averaged towers) moves it as much.

    Not where the model couples a tower's rows in training (batch norm, which UPDATE_OPS shows): there
    the rows' order reaches the gradients through the batch statistics, chaotically (a ResNet's
    normalised gradients move by percents), and is no round-off measure; the model tolerance applies,
    which a port meets by computing each replica's statistics over the same rows."""
    again = reordered(sides, batch, masks)
    if again is None or sides.legacy.moving:
        return {}
    moved = sides.legacy.gradients(*again).gradients
    out = {}
    for e in grad_errors(moved, grads):
        if MARGIN * e.rel_l2 > model:
            out[e.name] = Tolerance(f"gradient {e.name}", MARGIN * e.rel_l2,
                                    f"{MARGIN} x its spread with each tower's rows in another order ({e.rel_l2:.2g})")
    return out


def fixed_masks(sides: Sides, batch: Batch, training: bool = True) -> Masks:
    """Dropout noise for the legacy towers that does not change between runs (one seeded draw), so
    that two runs differ only by what is measured: in training mode, and in inference mode where a
    dropout is on there too (`Sides.always_on`; None where none is)."""
    legacy = sides.legacy
    if not legacy.dropouts or not (training or sides.always_on):
        return None
    tower_feed = legacy.feed(batch, training).towers
    rng = np.random.RandomState(sides.seed + 7)
    masks = []
    for k in range(max(legacy.dropout_index(d) for d in legacy.dropouts) + 1):
        shape = [d for d in legacy.dropouts if d.tower == 0 and legacy.dropout_index(d) == k][0].noise.shape[1:]
        masks.append([rng.uniform(size=(len(rows), *shape)).astype(np.float32) for rows in tower_feed.rows])
    return masks
