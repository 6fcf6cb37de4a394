"""The known differences between TF1 and Keras 3, each with a counterfactual the harness tries on a FAIL.

Each entry names a difference users of both meet again and again, and how it is tried where a FAIL
was localised (compare.diagnosis):

  on the port's layer     its padding or its batch norm's epsilon changed to the original's, the
                          layer run again on the legacy program's input to it;
  on the original's graph the loss, regulariser, smoothing and clip entries, run as changes of the
                          original (compare.counterfactuals), tried first; a schedule's constants
                          (schedule_constant) and the moving average's decay fed to the tensors
                          that compute the original's rate and decay; an optimizer entry that fits
                          run again as the original's own step with its update ops' constants fed;
  on the port's gradients its regulariser's term rescaled to the original's (a closed form, for
                          what no feed of the original's graph makes: a port-only regulariser), and
                          the port's regularisers read off its structure (port_regulariser);
  as a prediction         the original's optimizer rule, schedule, moving-statistics or moving-average
                          update with the known change made, against what the port did (the port's
                          own values; the rules are those `compare.optimizers` checks both sides by),
                          where no feed makes the change: a parameterisation, an epsilon's placement,
                          the port's own schedule object, moving statistics the original moves once
                          per tower.

The first entry under which the difference vanishes (every tensor within the tolerance it failed) is
the likely cause, reported with the error it then shows; where none does, the report says so and
names what was tried.  `CATALOGUE` lists every entry; each has a planted test in tests/test_causes.py
(or beside the pair it is planted in) in which its mistake is found and named.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from typing import Any, Callable, Iterator, Optional, Sequence

import keras
import numpy as np

from compare import optimizers
from compare.diagnosis import Layer, LayerRun, isolated_error
from compare.measures import (change_error, legacy_regularisers, modern_rate_at, modern_regularisers, rate, scales,
                              search)
from compare.report import EPS32
from compare.sides import Sides
from modern import keras_adapter

UNEXPLAINED = "no known cause explains it"


@dataclasses.dataclass(frozen=True)
class Cause:
    """One known difference: its key, where it applies (the kind of place a FAIL is localised to),
    what it is, and where users met it."""
    key: str
    kind: str
    title: str
    known_from: str


CATALOGUE: dict[str, Cause] = {c.key: c for c in (
    Cause("padding", "layer",
          "padding: slim pools and convolves with 'SAME' (windows from pixel 0) and pads strided convolutions "
          "explicitly and symmetrically (conv2d_same); a Keras layer with other padding sees other windows",
          "tf_slim resnet_utils.conv2d_same; keras.applications.ResNet50V2's ZeroPadding2D + 'valid' pool1"),
    Cause("bn_epsilon", "layer",
          "batch-norm epsilon: slim's batch_norm 0.001 (resnet_arg_scope 1e-5), TF1's fused kernel up to 2021 "
          "raised it to 1.001e-5, Keras' BatchNormalization 1e-3",
          "tensorflow/tensorflow#55545 and the Keras BatchNormalization docs"),
    Cause("port_regulariser", "structure",
          "a regulariser on other variables: TF1 programs add l2_loss over the weights they name (often the "
          "kernels only), a Keras port that sets a bias_regularizer, or a regularizer on every weight, "
          "regularises what the original leaves alone (and the other way round); 1e-4 of a bias is below any "
          "one step's tolerance, so only the structure shows it",
          "keras.layers.Dense / Conv2D kernel_regularizer and bias_regularizer; the original's l2 collection"),
    Cause("keep_prob", "dropout",
          "keep_prob against rate: tf.nn.dropout(keep_prob=p) keeps p of the units, keras.layers.Dropout(rate) "
          "drops rate of them: Dropout(p) keeps 1 - p",
          "the TF2 migration guide (tf.nn.dropout's rate argument)"),
    Cause("replica_masks", "dropout",
          "dropout masks under MirroredStrategy: keras.layers.Dropout draws stateless_dropout from its seed "
          "generator's state, a mirrored variable, so every replica drops the same units, where each TF1 tower's "
          "tf.nn.dropout is a random_uniform op of its own that draws a mask of its own",
          "keras-team/keras SeedGenerator under tf.distribute; each tower's own op in the TF1 graph"),
    Cause("regulariser_scale", "gradients",
          "regulariser scale: tf.nn.l2_loss (slim's l2_regularizer) is sum(w^2) / 2, Keras' L2(l) is l sum(w^2); "
          "a custom loop under MirroredStrategy that adds model.losses in every replica counts them once per "
          "replica",
          "keras-team/keras#19891; tf.nn.l2_loss's documentation"),
    Cause("clip_per_replica", "gradients",
          "clipping before the all-reduce: a clip by the global norm inside each replica (Keras' global_clipnorm "
          "or clipnorm applied in replica context, tf.clip_by_global_norm in the replica function) clips each "
          "replica's part of the gradient, where the original clips the towers' combined gradient",
          "tensorflow/tensorflow#33929 and #36001"),
    Cause("label_smoothing", "loss",
          "label smoothing: tf.losses.softmax_cross_entropy(label_smoothing=s) and Keras' "
          "CategoricalCrossentropy(label_smoothing=s) mix s/K into the targets; a port that drops it (or a sparse "
          "cross-entropy, which has none) trains on other targets: the loss moves by s (U - CE) per row and the "
          "logits' gradient by s (y - 1/K)",
          "the TF1 losses' and Keras' loss documentation"),
    Cause("loss_scale", "gradients",
          "the loss scaled by the replica count: each replica's loss averaged over its own rows (tf.reduce_mean, "
          "a Keras loss's default reduction) and the replicas' gradients summed are N times the original's average "
          "(a mean taken where the original sums: 1/N); tf.nn.compute_average_loss without global_batch_size takes "
          "the local rows times N, which differs only where the replicas' rows are uneven",
          "tf.nn.compute_average_loss's documentation; the TF2 custom-training-loop guide"),
    Cause("epsilon", "optimizer",
          "optimizer epsilon: Keras' optimizers default to 1e-7, TF1's Adam to 1e-8 and RMSProp to 1e-10",
          "tf.compat.v1.train.AdamOptimizer and keras.optimizers.Adam signatures"),
    Cause("slot_init", "optimizer",
          "the optimizer's state at the start: TF1's RMSPropOptimizer starts its mean square at 1 (its slot "
          "initialiser), Keras' RMSprop at 0: a port with another start takes other first steps, whatever its rule",
          "tf.compat.v1.train.RMSPropOptimizer's _create_slots; keras.optimizers.RMSprop.build"),
    Cause("momentum_parameterisation", "optimizer",
          "momentum: Keras' SGD keeps the velocity with the rate folded in (m = momentum m - lr g), TF1's "
          "MomentumOptimizer without it (a = momentum a + g; w -= lr a): the same only while the rate is constant",
          "the TF1-to-TF2 optimizer migration notes (tf.compat.v1.train.MomentumOptimizer)"),
    Cause("epsilon_placement", "optimizer",
          "RMSProp's epsilon: TF1 adds it inside the square root, sqrt(ms + eps); a port with sqrt(ms) + eps "
          "differs wherever ms is small",
          "tensorflow/tensorflow#58412"),
    Cause("adam_beta", "optimizer",
          "Adam's betas: TF1's AdamOptimizer(beta1=0.9, beta2=0.999) and Keras' Adam(beta_1, beta_2) share the "
          "defaults, but a port that takes another beta (a flag read into the other argument, a transformer's "
          "0.98, PyTorch code's own) moves its moments and bias correction otherwise",
          "tf.compat.v1.train.AdamOptimizer and keras.optimizers.Adam signatures"),
    Cause("staircase", "schedule",
          "staircase: tf.train.exponential_decay(..., staircase=True) decays in steps, Keras' ExponentialDecay "
          "defaults to staircase=False (and the other way round)",
          "keras.optimizers.schedules.ExponentialDecay's documentation"),
    Cause("cosine_alpha", "schedule",
          "the cosine decay's floor: tf.compat.v1.train.cosine_decay(..., alpha) and Keras' CosineDecay(..., alpha) "
          "both end at alpha times the rate; a port that leaves alpha at its default 0 (or sets the floor as a "
          "rate instead of a fraction) decays to another floor",
          "tf.compat.v1.train.cosine_decay and keras.optimizers.schedules.CosineDecay documentation"),
    Cause("schedule_offset", "schedule",
          "a schedule one step off: the port reads its step counter after the update where the original reads "
          "the global step before it (or the other way round)",
          "the order of optimizer.iterations and tf.train.get_global_step increments"),
    Cause("schedule_constant", "schedule",
          "a schedule's constant: the port's base rate, decay period, decay rate, a boundary or a value other "
          "than the original's (a period counted in other units, a flag read into another argument, a rate "
          "scaled for another batch size)",
          "tf.compat.v1.train.exponential_decay / piecewise_constant and their Keras schedules' arguments"),
    Cause("bn_momentum", "moving statistics",
          "batch-norm momentum: slim's decay (batch_norm 0.999, resnet_arg_scope 0.997) against Keras' "
          "BatchNormalization momentum 0.99",
          "tf_slim batch_norm and keras BatchNormalization signatures"),
    Cause("bessel", "moving statistics",
          "batch-norm moving variance: TF1's fused batch norm moves it toward the unbiased batch variance "
          "(n / (n - 1)), Keras 3's BatchNormalization toward the biased one",
          "tensorflow/tensorflow#55545"),
    Cause("replica_statistics", "moving statistics",
          "batch-norm statistics under MirroredStrategy: Keras 3 keeps the moving statistics per replica "
          "(aggregation NONE), so each copy moves with its own replica's rows and replica 0's is the one read",
          "keras-team/keras BatchNormalization under tf.distribute; the towers update one shared variable"),
    Cause("ema_decay", "averages",
          "the moving average's decay: a port that averages with another decay than the original's "
          "ExponentialMovingAverage(decay) (0.9999 in the CIFAR-10 tutorial, 0.99 a common default elsewhere); "
          "in the warm-up min(decay, (1 + n)/(10 + n)) both take the same value, past it they part",
          "tf.train.ExponentialMovingAverage's documentation"),
    Cause("ema_warmup", "averages",
          "moving-average warm-up: tf.train.ExponentialMovingAverage(decay, num_updates=step) averages at "
          "min(decay, (1 + step) / (10 + step)); a port without it averages at decay from the first step",
          "tensorflow/tensorflow#27392"),
)}


def likely(key: str, what: str, error: float, tolerance: float) -> str:
    """The report's cause line for a catalogue entry under which the difference vanished."""
    return (f"likely cause [{key}]: {what}: the difference then vanishes ({error:.3g} within {tolerance:.3g}). "
            f"{CATALOGUE[key].title[0].upper()}{CATALOGUE[key].title[1:]}.")


def unexplained(tried: Sequence[str]) -> str:
    return UNEXPLAINED + (f" (tried: {', '.join(dict.fromkeys(tried))})" if tried else
                          " (no catalogue entry applies here)")


def first_cause(entries: Sequence[Callable[[], str]]) -> str:
    """The first of `entries` (each an entry's run, its line) that names a likely cause; else the one
    unexplained line naming what every entry says it tried."""
    tried: list[str] = []
    for run in entries:
        line = run()
        if not line.startswith(UNEXPLAINED):
            return line
        said = re.match(re.escape(UNEXPLAINED) + r" \(tried: ([^)]*)\)", line)
        tried += said.group(1).split(", ") if said else []
    return unexplained(tried)


# ---------------------------------------------------------------------------------------------
# Layers: counterfactuals on the port's own layer

@dataclasses.dataclass
class Trial:
    """One counterfactual on a layer: what it changes, how to make and undo the change."""
    key: str
    what: str
    apply: Callable[[], None]
    undo: Callable[[], None]


def set_attr(obj: Any, name: str, value: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    old = getattr(obj, name)
    return (lambda: setattr(obj, name, value)), (lambda: setattr(obj, name, old))


def sublayers(layer: Any) -> list[Any]:
    return [layer] + (keras_adapter.all_layers(layer) if isinstance(layer, keras.layers.Layer) else [])


def layer_trials(run: LayerRun, e: Layer) -> Iterator[Trial]:
    """The layer counterfactuals that apply to `e`: each padding flipped; each batch norm's epsilon set
    to the one the legacy scope's batch-norm ops use."""
    for sub in sublayers(e.layer):
        padding = getattr(sub, "padding", None)
        if padding in ("same", "valid"):
            other = "valid" if padding == "same" else "same"
            yield Trial("padding", f"{sub.name} with padding={other!r} (the port has {padding!r})",
                        *set_attr(sub, "padding", other))
    epsilons = sorted(set(run.epsilons.get(e.name, ())))
    norms = [sub for sub in sublayers(e.layer) if isinstance(sub, keras.layers.BatchNormalization)]
    if len(epsilons) == 1 and norms and any(abs(n.epsilon - epsilons[0]) > 1e-12 for n in norms):
        eps = epsilons[0]
        changes = [set_attr(n, "epsilon", eps) for n in norms]
        ports = sorted({float(n.epsilon) for n in norms})

        def apply_all() -> None:
            for change, _ in changes:
                change()

        def undo_all() -> None:
            for _, undo in changes:
                undo()
        yield Trial("bn_epsilon", f"its batch norm's epsilon {eps:g} (the port has {', '.join(map(str, ports))})",
                    apply_all, undo_all)


def explain_layer(run: LayerRun, e: Layer, tolerance: float) -> str:
    """The first layer counterfactual under which `e`, on the legacy input, meets `tolerance`."""
    tried = []
    for trial in layer_trials(run, e):
        tried.append(trial.key)
        trial.apply()
        try:
            error = isolated_error(run, e)
        except Exception:  # noqa: BLE001 - a change the layer cannot run with (shapes that no longer fit) explains nothing
            error = float("inf")
        finally:
            trial.undo()
        if error <= tolerance:
            return likely(trial.key, trial.what, error, tolerance)
    return unexplained(tried)


# ---------------------------------------------------------------------------------------------
# Gradients: the port's regulariser term rescaled

Judge = Callable[[dict[str, np.ndarray]], tuple[bool, float, float]]


def explain_gradients(sides: Sides, legacy: dict[str, np.ndarray], modern: dict[str, np.ndarray],
                      weights: dict[str, np.ndarray], judge: Judge) -> str:
    """The regulariser-scale counterfactual: the port's gradient with its regulariser's term k c_m 2w
    taken out and the original's c_l 2w (where the original's loss adds it) put in, for k the ways a
    port weighs its model.losses (once, once per replica, not at all); then the loss-scale one: the
    port's data term (its gradient less its regulariser's), or its whole loss's gradient, divided by the
    replica count, or multiplied.
    judge: candidate modern gradients -> (all within tolerance, worst error, its tolerance)."""
    tried = []
    reg_l, added = legacy_regularisers(sides)
    reg_m, _ = modern_regularisers(sides)
    names = [n for n in modern if n in reg_l or n in reg_m]
    if names:
        tried.append("regulariser_scale")
        n_rep = sides.towers
        for k, how in ((1.0, "once"), (float(n_rep), f"once per replica ({n_rep})"), (0.0, "not at all")):
            candidate = dict(modern)
            for n in names:
                w = np.asarray(weights[n], np.float64)
                term_l = 2 * reg_l[n] * w if n in added else 0.0
                candidate[n] = np.asarray(modern[n], np.float64) - k * 2 * reg_m.get(n, 0.0) * w + term_l
            ok, worst, tol = judge(candidate)
            if ok:
                scale = ", ".join(sorted({f"{reg_m.get(n, 0.0):g} against {reg_l.get(n, 0.0) if n in added else 0:g}"
                                          for n in names}))
                return likely("regulariser_scale", f"the port's L2 coefficient{'s' if len(names) > 1 else ''} "
                                                   f"{scale} (c in c sum(w^2)), its model.losses added {how}, "
                                                   f"replaced by the original's term", worst, tol)
    for s, how in replica_scales(sides.towers, tried):
        for whole in ((False, True) if reg_m else (True,)):
            candidate = {}
            for n, g in modern.items():
                term_m = 2 * reg_m.get(n, 0.0) * np.asarray(weights[n], np.float64) if n in weights and not whole \
                    else 0.0
                candidate[n] = (np.asarray(g, np.float64) - term_m) / s + term_m
            ok, worst, tol = judge(candidate)
            if ok:
                part = ("whole loss (the data term and its regularisers')" if whole and reg_m else
                        "data term (its gradients less its regularisers')" if reg_m else "loss")
                return likely("loss_scale", f"the port's {part} {how} the original's, divided back", worst, tol)
    return unexplained(tried)


def replica_scales(replicas: int, tried: list[str]) -> list[tuple[float, str]]:
    """The loss_scale entry's candidates, the port's data term N times the original's or 1/N of it
    (none at one replica); the entry is added to `tried` where it has candidates."""
    if replicas < 2:
        return []
    tried.append("loss_scale")
    return [(float(replicas), f"{replicas} times"), (1 / replicas, f"1/{replicas} of")]


def explain_loss(sides: Sides, legacy: float, modern: float, weights: dict[str, np.ndarray], tolerance: float) -> str:
    """The regulariser-scale counterfactual on a loss whose layers all agree: the port's loss with its
    regularisers' sum k sum_v c_m sum(w^2) taken out and the original's put in."""
    reg_l, added = legacy_regularisers(sides)
    reg_m, _ = modern_regularisers(sides)
    if not reg_l and not reg_m:
        return explain_loss_scale(sides, legacy, modern, 0.0, tolerance, [])
    squares = {n: float(np.sum(np.square(np.asarray(weights[n], np.float64)))) for n in set(reg_l) | set(reg_m)}
    term_m = sum(c * squares[n] for n, c in reg_m.items())
    term_l = sum(c * squares[n] for n, c in reg_l.items() if n in added)
    for k, how in ((1.0, "once"), (float(sides.towers), f"once per replica ({sides.towers})"), (0.0, "not at all")):
        error = abs(modern - k * term_m + term_l - legacy) / max(abs(legacy), 1e-30)
        if error <= tolerance:
            return likely("regulariser_scale", f"the port's regularisers (sum {term_m:.4g}) added {how} to its loss, "
                                               f"the original's ({term_l:.4g}) in their place", error, tolerance)
    return explain_loss_scale(sides, legacy, modern, term_m, tolerance, ["regulariser_scale"])


def explain_clip_per_replica(parts: Sequence[dict[str, np.ndarray]], combined: dict[str, np.ndarray],
                             applied: dict[str, np.ndarray], modern: dict[str, np.ndarray], judge: Judge) -> str:
    """The clip_per_replica entry: where the original's applied gradient is its towers' combined one
    clipped (its global norm below the combined one's: the clip norm is that norm), each replica's
    part (`parts`, each tower's weighted gradient) clipped to that norm alone and then summed, against
    the port's: the candidate handed to `judge` (which compares with the original's) is the port's
    gradient less that prediction plus the original's, within tolerance exactly where the port
    applied the prediction."""
    tried = ["clip_per_replica"]
    norm = lambda g: float(np.sqrt(sum(np.sum(np.square(np.asarray(v, np.float64))) for v in g.values())))  # noqa: E731
    clip = norm(applied)
    if len(parts) < 2 or not clip < norm(combined) * (1 - 1e-6):
        return unexplained(tried)
    predicted = {n: sum(np.asarray(p[n], np.float64) * min(1.0, clip / max(norm(p), 1e-30)) for p in parts)
                 for n in applied}
    candidate = {n: np.asarray(modern[n], np.float64) - predicted[n] + np.asarray(applied[n], np.float64)
                 for n in modern if n in predicted}
    ok, worst, tol = judge(candidate)
    if ok:
        return likely("clip_per_replica", f"each of the {len(parts)} replicas' parts clipped to the original's clip "
                                          f"norm {clip:.4g} alone, then summed, is what the port applied", worst, tol)
    return unexplained(tried)


def explain_smoothing(bias: tuple[np.ndarray, np.ndarray], direction: np.ndarray, losses: tuple[float, float],
                      per_smoothing: float, tolerance: float) -> str:
    """The label_smoothing entry on a loss whose layers all agree: the smoothing difference d that
    the loss difference takes (the loss moves by d (U - CE) per row), and the port's gradient of the
    bias the logits add last against the legacy one moved by d (y - 1/K) per row, up to one common
    scale (a clip by the global norm scales each side's gradients by its own factor).

    bias: (legacy, modern) gradient of that bias; direction: the rows' mean of (y - 1/K);
    losses: (legacy, modern) loss; per_smoothing: the rows' mean of (U - CE), U the mean of -log p
    over the classes, CE the true class's -log p."""
    tried = ["label_smoothing"]
    legacy, modern = (np.asarray(b, np.float64) for b in bias)
    if len(direction) < 3:
        return unexplained(tried)
    basis = np.stack([legacy, direction], axis=1)
    coef, *_ = np.linalg.lstsq(basis, modern, rcond=None)
    error = float(np.linalg.norm(modern - basis @ coef) / max(np.linalg.norm(modern), 1e-30))
    unclipped = abs(coef[0] - 1) <= tolerance  # no clip on either side: the move itself is d (y - 1/K)
    if unclipped:
        d = float(coef[1])
        error = max(error, abs(losses[1] - d * per_smoothing - losses[0]) / max(abs(losses[0]), 1e-30))
    elif per_smoothing != 0:
        d = (losses[1] - losses[0]) / per_smoothing
    else:
        return unexplained(tried)
    # A smoothing is a fraction of the targets: a difference of 1 or more is no smoothing's (a loss scaled
    # by k moves the same way, and is the loss_scale entry's).
    if 1e-3 <= abs(d) < 1 and error <= tolerance:
        how = ("the logits-bias gradient's move and the loss's" if unclipped else
               "the loss's move; the logits-bias gradient's components then agree up to a common scale, a clip")
        return likely("label_smoothing", f"the port's label smoothing {d:+.3g} from the original's ({how})", error,
                      tolerance)
    return unexplained(tried)


def explain_loss_scale(sides: Sides, legacy: float, modern: float, term_m: float, tolerance: float,
                       tried: list[str]) -> str:
    """The loss_scale entry on a loss whose layers all agree: the port's data term (its loss less its
    regularisers' `term_m`), or its whole loss, divided by the replica count, or multiplied by it."""
    tried = list(tried)
    for s, how in replica_scales(sides.towers, tried):
        for kept in ((term_m, 0.0) if term_m else (0.0,)):
            error = abs((modern - kept) / s + kept - legacy) / max(abs(legacy), 1e-30)
            if error <= tolerance:
                part = (f"data term (its loss {modern:.4g} less its regularisers {term_m:.4g})" if kept else
                        f"whole loss ({modern:.4g}, its regularisers' {term_m:.4g} included)" if term_m else
                        f"loss ({modern:.4g})")
                return likely("loss_scale", f"the port's {part} {how} the original's, divided back", error, tolerance)
    return unexplained(tried)


# ---------------------------------------------------------------------------------------------
# Structure: what each side regularises (a port-only property: the port's own regularisers)

def explain_structure(legacy: dict[str, float], modern: dict[str, float], tolerance: float) -> str:
    """The port_regulariser entry (a closed form: the port's own regularisers, which no feed of the
    original's graph changes): the port's L2 coefficients with those on variables the original leaves
    alone removed, and those it leaves out given the original's, against the original's; then the
    regulariser_scale entry on what is left, one ratio k for every coefficient."""
    extra = sorted(set(modern) - set(legacy))
    missing = sorted(set(legacy) - set(modern))
    mended = {n: c for n, c in modern.items() if n in legacy} | {n: legacy[n] for n in missing}
    ratios = {n: mended[n] / legacy[n] for n in legacy if legacy[n]}
    off = max((abs(k - 1) for k in ratios.values()), default=0.0)
    if (extra or missing) and off <= tolerance:
        words = [f"the port regularises {len(extra)} variable{'s' if len(extra) > 1 else ''} the original leaves "
                 f"alone ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})"] if extra else []
        words += [f"the port leaves {len(missing)} the original regularises unregularised ({', '.join(missing[:3])}"
                  f"{', ...' if len(missing) > 3 else ''})"] if missing else []
        return likely("port_regulariser", "; ".join(words) + ": with those regularisers as the original has them",
                      off, tolerance)
    values = list(ratios.values())
    if not extra and not missing and values and max(values) - min(values) <= tolerance * max(values):
        k = float(np.mean(values))
        return likely("regulariser_scale", f"the port's L2 coefficients {k:.4g} times the original's (Keras' "
                                           f"L2(c) is c sum(w^2), tf.nn.l2_loss is sum(w^2) / 2): divided by {k:.4g}",
                      max(abs(v / k - 1) for v in values), tolerance)
    return unexplained(["port_regulariser", "regulariser_scale"])


# ---------------------------------------------------------------------------------------------
# Optimizers: the original's rule with a known change, against what the port's update did

def optimizer_variants(legacy: optimizers.Rule, modern: optimizers.Rule) -> Iterator[tuple[str, str, optimizers.Rule]]:
    """(entry, what, the legacy rule with the change) for every optimizer entry that applies."""
    if "epsilon" in legacy.hyper():
        candidates = [1e-7, 1e-8, 1e-10, 1.0] + ([modern.epsilon] if modern.known and modern.epsilon else [])
        for eps in dict.fromkeys(candidates):
            if eps != legacy.epsilon:
                yield ("epsilon", f"epsilon {eps:g} where the original's is {legacy.epsilon:g}",
                       dataclasses.replace(legacy, epsilon=eps))
    if legacy.rule == "momentum" and legacy.side == "tf1":
        yield ("momentum_parameterisation", "Keras' SGD momentum rule (the rate folded into the velocity) with the "
                                            "original's momentum",
               optimizers.Rule("momentum", "keras", momentum=legacy.momentum, nesterov=legacy.nesterov))
    if legacy.rule in ("rmsprop", "centered_rmsprop"):
        yield ("epsilon_placement", "epsilon outside the square root, sqrt(ms) + eps",
               dataclasses.replace(legacy, epsilon_outside=True))


def explain_optimizer(sides: Sides, r: Any) -> str:
    """The optimizer entries at restart step `r` (compare.checks.steps.RestartStep): the original's rule
    with the entry's change, from the state the step started from on the legacy gradient at the legacy
    rate, against the port's own update of the same (r.port_weights)."""
    legacy, modern = sides.legacy, sides.modern
    if not legacy.rule.known:
        return unexplained([]) + f"; the original's optimizer ({legacy.rule.describe()}) is a rule the harness " \
                                 f"does not know"
    tol = sides.tol.optimizer.rel_l2
    lr = rate(r.legacy)
    b1, b2 = legacy.rule.beta1, legacy.rule.beta2
    powers = (float(np.float32(b1) ** (r.step + 1)), float(np.float32(b2) ** (r.step + 1)))

    def worst_for(rule: optimizers.Rule, at: float) -> float:
        worst = 0.0
        for n in legacy.trainable:
            slots = optimizers.modern_slots_from_legacy(rule, r.before.slots[n], r.lr_state)
            before = dict(slots, w=r.before.weights[n])
            predicted = optimizers.predict(rule, before, r.legacy.gradients[n], at, powers)["w"]
            worst = max(worst, change_error(n, r.before.weights[n], r.port_weights[n], predicted, tol).rel_l2)
        return worst
    port_lr = r.modern.lr
    if port_lr is not None and np.float32(port_lr) != np.float32(lr) and worst_for(legacy.rule, port_lr) <= tol:
        return (f"the port's update is the original's rule at the port's rate {port_lr:g} (the original's {lr:g}): "
                + explain_schedule(sides, [r.step]))
    tried = []
    for key, what, variant in optimizer_variants(legacy.rule, modern.rule):
        tried.append(key)
        worst, differs = 0.0, 0.0
        for n in legacy.trainable:
            before = dict(optimizers.modern_slots_from_legacy(variant, r.before.slots[n], r.lr_state),
                          w=r.before.weights[n])
            predicted = optimizers.predict(variant, before, r.legacy.gradients[n], lr, powers)["w"]
            worst = max(worst, change_error(n, r.before.weights[n], r.port_weights[n], predicted, tol).rel_l2)
            # The change must make a difference here: against the original's update, not only the port's.
            differs = max(differs, change_error(n, r.before.weights[n], predicted, r.legacy_after.weights[n],
                                                tol).rel_l2)
            if worst > tol:
                break
        if worst <= tol and differs > tol:
            ran = run_on_graph(sides, r, variant)
            if ran is None:
                return likely(key, f"the port's update is the original's rule with {what} (step {r.step}, every "
                                   f"variable; predicted: no feed of the original's graph makes this change)",
                              worst, tol)
            if ran[0] <= tol:
                return likely(key, f"the port's update is the original's rule with {what} (step {r.step}, every "
                                   f"variable): the original's step run with {ran[1]}", ran[0], tol)
    if legacy.rule.rule == "adam":
        tried.append("adam_beta")
        found = explain_adam_beta(sides, r, lr)
        if found:
            return found
    return unexplained(tried)


BETAS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999)


def explain_adam_beta(sides: Sides, r: Any, lr: float) -> Optional[str]:
    """The adam_beta entry at restart step `r`: the original's Adam with beta1, or beta2, another value
    (its bias correction at that beta's power), found by a one-dimensional search over the distance of
    the predicted update to the port's, from the state the step started from on the legacy gradient.
    Where the step's slots let the other beta fit as well (zero slots: a beta only scales the update),
    the line says so: from a trained state only the right one fits."""
    legacy = sides.legacy
    tol = sides.tol.optimizer.rel_l2
    names = list(legacy.trainable)
    port = {n: np.asarray(r.port_weights[n], np.float64) - r.before.weights[n] for n in names}
    norm = max(sum(float(np.sum(np.square(port[n]))) for n in names), 1e-300)

    def predicted(rule: optimizers.Rule) -> dict[str, np.ndarray]:
        powers = (float(np.float32(rule.beta1) ** (r.step + 1)), float(np.float32(rule.beta2) ** (r.step + 1)))
        out = {}
        for n in names:
            before = dict(optimizers.modern_slots_from_legacy(rule, r.before.slots[n], r.lr_state),
                          w=r.before.weights[n])
            out[n] = optimizers.predict(rule, before, r.legacy.gradients[n], lr, powers)["w"]
        return out

    def distance(rule: optimizers.Rule) -> float:
        p = predicted(rule)
        return math.sqrt(sum(float(np.sum(np.square(p[n] - r.before.weights[n] - port[n]))) for n in names) / norm)
    def with_beta(field: str, b: float) -> optimizers.Rule:
        return dataclasses.replace(legacy.rule, beta1=b) if field == "beta1" else \
            dataclasses.replace(legacy.rule, beta2=b)
    fits = []
    for field in ("beta1", "beta2"):
        own = float(getattr(legacy.rule, field))
        grid = list(BETAS) + ([float(getattr(sides.modern.rule, field))] if sides.modern.rule.known else [])
        value = search(functools.partial(lambda f, b: distance(with_beta(f, b)), field), [b for b in grid if 0 < b < 1])
        p = predicted(with_beta(field, value))
        worst = max(change_error(n, r.before.weights[n], r.port_weights[n], p[n], tol).rel_l2 for n in names)
        differs = max(change_error(n, r.before.weights[n], p[n], r.legacy_after.weights[n], tol).rel_l2 for n in names)
        if worst <= tol and differs > tol and abs(value - own) > 1e-6:
            fits.append((worst, field, value, own))
    if not fits:
        return None
    worst, field, value, own = min(fits)
    also = [f"{f} {v:.6g}" for _, f, v, _ in fits if f != field]
    ran = run_on_graph(sides, r, with_beta(field, value))
    if ran is not None and ran[0] > tol:
        return None  # the original's own update, so changed, does not make the port's
    return likely("adam_beta", f"the port's update is the original's Adam with {field} {value:.6g} where the "
                               f"original's is {own:g} (step {r.step}, every variable, {field} found by a search)"
                  + (f": the original's step run with {ran[1]}" if ran is not None else "")
                  + (f"; {also[0]} fits as well: the step's slots cannot tell the two apart" if also else ""),
                  ran[0] if ran is not None else worst, tol)


def run_on_graph(sides: Sides, r: Any, rule: optimizers.Rule) -> Optional[tuple[float, str]]:
    """The original's own training step from `r`'s state on its rows and masks, with the hyper-parameter
    inputs of its update ops fed `rule`'s values where they differ from its own (and, for Adam's betas,
    its beta powers fed that beta's power): (the worst error of the port's update against it, the
    change in words); None where `rule` differs from the original's otherwise (a parameterisation, an
    epsilon's placement: no feed makes it) or the step's rows were not kept."""
    legacy = sides.legacy
    base = legacy.rule
    hyper = optimizers.HYPER.get(base.rule, ())
    differ = [f.name for f in dataclasses.fields(base) if f.name != "label" and getattr(base, f.name) !=
              getattr(rule, f.name)]
    if r.batch is None or not differ or any(f not in hyper for f in differ):
        return None
    updates = list(legacy.updates.values())
    if not all(f in u.inputs for u in updates for f in differ):
        return None
    feed: dict[Any, Any] = {}
    for u in updates:
        for f in differ:
            value = np.float32(getattr(rule, f))
            feed[u.inputs[f]] = value
            if f in ("beta1", "beta2") and f"{f}_power" in u.inputs:
                feed[u.inputs[f"{f}_power"]] = value ** np.float32(r.step + 1)
    after = legacy.changed_step(r.before, r.batch, r.legacy.masks, feed)
    tol = sides.tol.optimizer.rel_l2
    worst = max(change_error(n, r.before.weights[n], r.port_weights[n], after[n], tol).rel_l2 for n in legacy.trainable)
    return worst, ", ".join(f"its update ops' {f} fed {getattr(rule, f):g}" for f in differ)


def explain_trajectory(sides: Sides, start: Any, steps: int,
                       given: Callable[[str], str] = lambda line: line) -> str:
    """The optimizer entries on the port's own trajectory: the port trained freely from `start` for a few
    steps, its updates (from its own weights, on its own gradients, at its own rates) predicted by the
    original's rule carried along, and by that rule with each entry's change.  An entry explains the
    trajectory when its prediction holds at every step and the original's rule does not (momentum
    under a rate that changes: the restart steps, which continue the legacy state exactly, cannot see it).
    Where the original's rule holds at the original's rates, the updates were given other gradients:
    `given(line)` says why (the caller's counterfactuals on a step's loss and gradients), `line` the
    fallback."""
    legacy, modern = sides.legacy, sides.modern
    if not legacy.rule.known:
        return unexplained([])
    tol = sides.tol.optimizer.rel_l2
    names = list(legacy.trainable)
    lr0 = sides.set_both(start)
    record = []  # (weights before, gradients, rate, weights after) per step
    for k in range(min(steps, 4)):
        before = modern.weights(names)
        out = modern.step(sides.batch(seed=200 + k), before=modern.state())
        record.append((before, out.gradients, float(out.lr or 0.0), modern.weights(names)))

    def worst(rule: optimizers.Rule) -> float:
        state = {n: dict(optimizers.modern_slots_from_legacy(rule, start.slots[n], lr0), w=start.weights[n])
                 for n in names}
        b1, b2 = rule.beta1, rule.beta2
        error = 0.0
        for k, (w_before, grads, lr, w_after) in enumerate(record):
            t = start.step + k + 1
            powers = (float(np.float32(b1) ** t), float(np.float32(b2) ** t))
            for n in names:
                state[n]["w"] = np.asarray(w_before[n], np.float64)  # from the port's own weights
                state[n] = optimizers.predict(rule, state[n], grads[n], lr, powers)
                error = max(error, change_error(n, w_before[n], w_after[n], state[n]["w"], tol).rel_l2)
        return error
    if worst(legacy.rule) <= tol:
        steps_run = [start.step + k for k in range(len(record))]
        if any(np.float32(lr) != np.float32(legacy.learning_rate_at(s)) for s, (_, _, lr, _) in zip(steps_run, record)):
            return explain_schedule(sides, steps_run)  # the rule holds; the rates it was given do not
        return given(unexplained([]) + "; the port's own trajectory follows the original's rule at the original's "
                                       "rates")
    tried = []
    for key, what, variant in optimizer_variants(legacy.rule, modern.rule):
        tried.append(key)
        error = worst(variant)
        if error <= tol:
            return likely(key, f"the port's own updates over {len(record)} free steps are the original's rule with "
                               f"{what}, not the original's rule", error, tol)
    return unexplained(tried)


# ---------------------------------------------------------------------------------------------
# Schedules: the port's schedule with a known change, against the original's

def want_at(legacy: Any, step: int) -> np.float32:
    return np.float32(legacy.learning_rate_at(step))


def explain_schedule(sides: Sides, steps: Sequence[int]) -> str:
    """The schedule entries: the port's own schedule object with `staircase` flipped, its cosine floor
    `alpha` set to the original's (its rate at the port's decay_steps over its rate at 0), and read one
    step off, against the legacy rate at `steps`."""
    legacy, modern = sides.legacy, sides.modern
    want = {s: want_at(legacy, s) for s in steps}
    tried = []

    def worst(rate_at: Callable[[int], float]) -> float:
        return max(abs(float(np.float32(rate_at(s))) - float(w)) / max(abs(float(w)), 1e-30) for s, w in want.items())
    schedule: Any = getattr(modern.optimizer, "_learning_rate", None)
    if hasattr(schedule, "staircase"):
        tried.append("staircase")
        old = schedule.staircase
        schedule.staircase = not old
        try:
            error = worst(lambda s: modern_rate_at(modern, s))
        finally:
            schedule.staircase = old
        if error <= 4 * EPS32:
            return likely("staircase", f"the port's schedule with staircase={not old}", error, 4 * EPS32)
    if hasattr(schedule, "alpha") and hasattr(schedule, "decay_steps"):
        tried.append("cosine_alpha")
        start, end = float(want_at(legacy, 0)), float(want_at(legacy, int(schedule.decay_steps)))
        alpha = end / start if start else None
        if alpha is not None and abs(alpha - float(schedule.alpha)) > 1e-6:
            old_alpha = schedule.alpha
            schedule.alpha = alpha
            try:
                error = worst(lambda s: modern_rate_at(modern, s))
            finally:
                schedule.alpha = old_alpha
            if error <= 4 * EPS32:
                return likely("cosine_alpha", f"the port's cosine decay with alpha={alpha:.4g}, the original's floor "
                                              f"(its rate at step {int(schedule.decay_steps)} over its rate at 0; the "
                                              f"port has alpha={float(old_alpha):g})", error, 4 * EPS32)
    tried.append("schedule_offset")
    for shift in (-1, 1):
        shown = [s for s in want if s + shift >= 0]  # a step with no step before it shows no offset
        if not shown:
            continue
        error = max(abs(float(np.float32(modern_rate_at(modern, s + shift))) - float(want[s]))
                    / max(abs(float(want[s])), 1e-30) for s in shown)
        if error <= 4 * EPS32:
            return likely("schedule_offset", "the port's schedule runs one step behind (its rate at step s + 1 is the "
                                             "original's at s)" if shift > 0 else
                          "the port's schedule runs one step ahead (its rate at step s - 1 is the original's at s)",
                          error, 4 * EPS32)
    tried.append("schedule_constant")
    found = schedule_constant(legacy, {s: float(np.float32(modern_rate_at(modern, s))) for s in want})
    return found or unexplained(tried)


def schedule_constant(legacy: Any, port: dict[int, float]) -> Optional[str]:
    """The schedule_constant entry, on the original's graph: each scalar constant its rate is computed
    from (its base, period, decay, boundaries, values) fed another value, found by a one-dimensional
    search (floats: scales of the constant, then golden section; integers: the neighbours, double and
    half), against the port's rate at each step of `port`; the constant that leaves the least, where
    the rates then agree at every step."""
    f = legacy.schedule
    tol = 4 * EPS32

    def worst(changes: dict[str, float]) -> float:
        return max(abs(float(np.float32(f(s, changes))) - p) / max(abs(p), 1e-30) for s, p in port.items())
    best: Optional[tuple[float, str, float, float]] = None
    for name, tensor in f.constants.items():
        v0 = f.value(name)
        changed = functools.partial(lambda name, c: worst({name: c}), name)
        if tensor.dtype.is_integer:
            candidates = sorted({v0 + d for d in (-2.0, -1.0, 1.0, 2.0)} | {2 * v0, float(v0 // 2)} - {v0})
            v = min(candidates, key=changed)
        else:
            v = search(changed, [v0 * k for k in scales(1)] + [v0 - 1, v0 + 1])
        error = changed(v)
        if error <= tol and np.float32(v) != np.float32(v0) and (best is None or error < best[0]):
            best = (error, name, v0, v)
    if best is None:
        return None
    error, name, v0, v = best
    return likely("schedule_constant", f"the original's schedule with its constant {name} ({v0:.6g}) at {v:.6g} "
                                       f"gives the port's rate at every step compared ({len(port)})", error, tol)


# ---------------------------------------------------------------------------------------------
# Moving statistics and moving averages: the modern update predicted with known changes

@dataclasses.dataclass(frozen=True)
class MovingVariant:
    """How the port might move a batch-norm statistic: at its own layer's momentum (not the legacy
    decay), toward the biased variance, toward replica 0's statistics."""
    momentum: bool = False
    biased: bool = False
    replica_zero: bool = False

    def keys(self) -> list[str]:
        return (["bn_momentum"] if self.momentum else []) + (["bessel"] if self.biased else []) \
            + (["replica_statistics"] if self.replica_zero else [])


def moving_variants(momenta_differ: bool, towers: int) -> list[MovingVariant]:
    """Every combination of the moving-statistics entries that applies (the plain prediction excluded),
    fewest changes first."""
    out = []
    for momentum, biased, zero in itertools.product((False, True) if momenta_differ else (False,), (False, True),
                                                    (False, True)):
        if zero and towers < 2:
            continue
        variant = MovingVariant(momentum, biased, zero)
        if variant.keys():
            out.append(variant)
    return sorted(out, key=lambda v: len(v.keys()))


def describe_moving(variant: MovingVariant, momenta: Sequence[float]) -> str:
    parts = []
    if variant.momentum:
        parts.append(f"momentum {', '.join(f'{m:g}' for m in sorted(set(momenta)))} (its layers' own)")
    if variant.biased:
        parts.append("the biased batch variance")
    if variant.replica_zero:
        parts.append("replica 0's statistics only")
    return "the port's update with " + " and ".join(parts)


def explain_moving(judge: Callable[[MovingVariant], tuple[bool, float, float]], momenta: Sequence[float],
                   towers: int) -> str:
    """The first combination of moving-statistics entries whose prediction the port's updates meet.
    judge: a variant -> (every modern update within tolerance of that prediction, worst, tolerance);
    momenta: the port's batch norms' momenta where they differ from the legacy decays."""
    tried: list[str] = []
    for variant in moving_variants(bool(momenta), towers):
        tried += variant.keys()
        ok, worst, tol = judge(variant)
        if ok:
            keys = variant.keys()
            line = likely(keys[0], describe_moving(variant, momenta), worst, tol)
            if len(keys) > 1:
                line += " Together with: " + "; ".join(CATALOGUE[k].title for k in keys[1:]) + "."
            return line
    return unexplained(tried)


def explain_averages(judge: Callable[[Callable[[float], float]], tuple[bool, float, float]],
                     d: Callable[[float], float], far: float, fitted: Optional[float] = None,
                     on_graph: Sequence[tuple[str, float, Callable[[float], Callable[[float], float]]]] = (),
                     last: Optional[float] = None) -> str:
    """The warm-up entry: the port's shadow updates against the legacy ones predicted with the decay
    without its warm-up (d(far) at every step: the original's decay tensor past its warm-up), or with
    TF1's warm-up where the legacy has none.  Then the decay entry: `fitted`, the decay the port's last
    shadow update took (past the warm-up), fed to each constant of the original's decay tensor
    (`on_graph`: name, value, value -> the changed d(n)), its own warm-up or its absence kept; where no
    constant is the decay, the formula with the original's warm-up or its absence.  `last`: the step
    counter the fitted update averaged at; where TF1's warm-up (1 + n) / (10 + n) there is the fitted
    decay, any decay above it gives the same, and the line says so."""
    final = d(far)
    warm_up_in_legacy = d(0) != final
    variant = (lambda n: final) if warm_up_in_legacy else (lambda n: min(final, (1 + n) / (10 + n)))
    ok, worst, tol = judge(variant)
    if ok:
        what = ("the port averages at the final decay from the first step (no num_updates)" if warm_up_in_legacy
                else "the port warms up with num_updates where the original does not")
        return likely("ema_warmup", what, worst, tol)
    if fitted is None or not 0 < fitted < 1:
        return unexplained(["ema_warmup"])
    own = fitted
    floor = last is not None and abs(own - (1 + last) / (10 + last)) <= 1e-6
    words = (f"a decay of {own:.6g} or more (at step {last:g} the warm-up (1 + n) / (10 + n) is {own:.6g}: any "
             f"decay above it averages the same)" if floor else f"decay {own:.6g}")
    for name, value, changed in on_graph:
        if abs(value - final) > 1e-6 * max(abs(final), 1.0):
            continue  # not the decay: a warm-up's constant
        ok, worst, tol = judge(changed(own))
        if ok:
            return likely("ema_decay", f"the port averages with {words} where the original's is {final:g}: the "
                                       f"original's decay tensor with its constant {name} fed {own:.6g}", worst, tol)
    ok, worst, tol = judge((lambda n: min(own, (1 + n) / (10 + n))) if warm_up_in_legacy else (lambda n: own))
    if ok:
        return likely("ema_decay", f"the port averages with {words} where the original's is {final:g} (predicted: "
                                   f"no constant of the original's decay tensor is its decay)", worst, tol)
    return unexplained(["ema_warmup", "ema_decay"])


def explain_slot_init(rule: str, started: dict[str, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]) -> str:
    """The slot_init entry: `started` maps each variable to (the original's initial slots, the same
    values set in the port's own parameterisation and read back): where every one agrees, the port
    holds the original's start and only its own initial values differ."""
    worst = 0.0
    for want, back in started.values():
        if sorted(want) != sorted(back):
            return unexplained(["slot_init"])
        for key in want:
            worst = max(worst, float(np.max(np.abs(np.asarray(back[key], np.float64) - want[key]), initial=0.0)))
    tolerance = 2 * EPS32
    if worst <= tolerance:
        return likely("slot_init", f"the port's optimizer given the original's initial slots ({rule}: "
                                   f"{', '.join(sorted(next(iter(started.values()))[0]))}) holds them", worst,
                      tolerance)
    return unexplained(["slot_init"])


def explain_replica_masks(agree: float, expected: float, sigma: float, retry: Callable[[], float]) -> str:
    """The replica_masks entry: the port's replicas' masks agree on `agree` of the units where independent
    masks agree on `expected`; `retry()` gives their agreement with each replica's id folded into its seed."""
    if agree - expected <= 5 * sigma:
        return unexplained(["replica_masks"])
    again = retry()
    error = abs(again - expected)
    if error <= 5 * sigma:
        return likely("replica_masks", f"the port's replicas drop the same units (they agree on {agree:.4f}); with "
                                       f"each replica's id folded into its seed they agree on {again:.4f}, as "
                                       f"independent masks do ({expected:.4f})", error, 5 * sigma)
    return unexplained(["replica_masks"])


def explain_dropout(kept: float, rate_legacy: float, sigma: float, retry: Callable[[], float]) -> str:
    """The keep_prob entry: the port keeps `kept` of the units; with its Dropout's rate set to
    1 - rate, `retry()` gives the fraction it then keeps, against the legacy 1 - rate_legacy."""
    if abs(kept - rate_legacy) > 5 * sigma:
        return unexplained(["keep_prob"])
    again = retry()
    error = abs(again - (1 - rate_legacy))
    if error <= 5 * sigma:
        return likely("keep_prob", f"the port's Dropout given the keep probability as its rate; with rate "
                                   f"{rate_legacy:g} it keeps {again:.4f}", error, 5 * sigma)
    return unexplained(["keep_prob"])
