"""The optimizers' update rules on each side, read from each side's own configuration.

TF1 (the kernels `tf.compat.v1.train` optimizers run, training_ops.cc; the rule named by the update
op's type, its hyper-parameters read from the op's inputs in the graph) and Keras 3 (`update_step`;
hyper-parameters from `optimizer.get_config()`), t = the step's 1-based count, g the gradient the
update receives:

    sgd               both:   w -= lr g
    momentum          TF1:    a = mom a + g;  w -= lr a           (nesterov: w -= lr (g + mom a))
                      Keras:  m = mom m - lr g;  w += m           (nesterov: w += mom m - lr g)
                      The two keep different slots: from the same history with a constant rate
                      m = -lr a; under a rate that changes they differ (TF1 applies today's rate to the
                      whole accumulated velocity, Keras folded each step's rate in as it went).
    adam              both:   m += (g - m)(1 - b1);  v += (g^2 - v)(1 - b2)
                              w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)
                      (TF1 keeps b^t as running products beta1_power, beta2_power; Keras computes b^t)
    rmsprop           both:   ms += (g^2 - ms)(1 - rho)   [Keras: rho ms + (1 - rho) g^2]
                              mom = momentum mom + lr g / sqrt(ms + eps);  w -= mom
                      centered: mg += (g - mg)(1 - rho), the root of ms - mg^2 + eps.  TF1 starts ms at
                      1, Keras at 0; TF1's default eps is 1e-10, Keras' 1e-7.
    adagrad           TF1:    acc += g^2;  w -= lr g / sqrt(acc)          (AdagradV2: / (sqrt(acc) + eps))
                      Keras:  acc += g^2;  w -= lr g / sqrt(acc + eps)
    adadelta          both:   acc = rho acc + (1 - rho) g^2;  u = sqrt(up + eps) / sqrt(acc + eps) g
                              w -= lr u;  up = rho up + (1 - rho) u^2
    ftrl              both:   n = acc + g^2;  lin += g' - (n^-p - acc^-p) / lr w   (g' = g + 2 l2s w)
                              w = |lin| > l1 ? (sign(lin) l1 - lin) / (n^-p / lr + 2 l2) : 0;  acc = n
                      (Keras adds beta / (2 lr) to l2)
    proximal_sgd      TF1:    p = w - lr g;  w = sign(p) max(|p| - lr l1, 0) / (1 + lr l2)
    proximal_adagrad  TF1:    acc += g^2;  r = lr / sqrt(acc);  p = w - r g
                              w = sign(p) max(|p| - r l1, 0) / (1 + r l2)

Each side's update is judged against its own rule where the harness knows it, from the slots it
started from and ended with and the gradient its update received; and the port's optimizer is judged
against the legacy program's, from the same state and the legacy gradient (compare.checks.steps).
An optimizer the harness does not know (Keras' AdamW, Nadam, Lion, ..., a user's own subclass) has
the Rule "" and is judged against the other side only.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

from compare.report import BLOCK, EPS32, Sums, TensorError, errors_of

Arrays = dict[str, np.ndarray]

# TF1: the update op's type (its `Resource` form too) -> the rule.  The op's input names (its OpDef)
# give the slots and hyper-parameters (SLOTS, HYPER); the rate is `lr` (or `alpha`), the gradient
# `grad` (or `delta`).
TF1_OPS = {
    "ApplyGradientDescent": "sgd", "ApplyMomentum": "momentum", "ApplyAdam": "adam",
    "ApplyRMSProp": "rmsprop", "ApplyCenteredRMSProp": "centered_rmsprop", "ApplyAdagrad": "adagrad",
    "ApplyAdagradV2": "adagrad_v2", "ApplyAdadelta": "adadelta", "ApplyFtrl": "ftrl", "ApplyFtrlV2": "ftrl",
    "ApplyProximalGradientDescent": "proximal_sgd", "ApplyProximalAdagrad": "proximal_adagrad",
}
# Each side's slots per rule: TF1's by its kernel's input names (the names a State keeps slots under),
# Keras' by the names its `build` gives them (the suffix of each slot variable's name).
SLOTS = {
    "tf1": {"sgd": (), "momentum": ("accum",), "adam": ("m", "v"), "rmsprop": ("ms", "mom"),
            "centered_rmsprop": ("mg", "ms", "mom"), "adagrad": ("accum",), "adagrad_v2": ("accum",),
            "adadelta": ("accum", "accum_update"), "ftrl": ("accum", "linear"), "proximal_sgd": (),
            "proximal_adagrad": ("accum",)},
    "keras": {"sgd": (), "momentum": ("momentum",), "adam": ("momentum", "velocity"),
              "rmsprop": ("velocity", "momentum"), "centered_rmsprop": ("velocity", "momentum", "average_gradient"),
              "adagrad": ("accumulator",), "adadelta": ("accumulated_grad", "accumulated_delta_var"),
              "ftrl": ("accumulator", "linear")},
}
# Keras slot -> the TF1 slot holding the same quantity, per rule (momentum: another parameterisation).
KERAS_TO_TF1 = {
    "adam": {"momentum": "m", "velocity": "v"},
    "rmsprop": {"velocity": "ms", "momentum": "mom"},
    "centered_rmsprop": {"velocity": "ms", "momentum": "mom", "average_gradient": "mg"},
    "adagrad": {"accumulator": "accum"},
    "adadelta": {"accumulated_grad": "accum", "accumulated_delta_var": "accum_update"},
    "ftrl": {"accumulator": "accum", "linear": "linear"},
}
# The hyper-parameters each TF1 kernel reads (beside its rate), by their input names.
HYPER = {"momentum": ("momentum",), "adam": ("beta1", "beta2", "epsilon"), "rmsprop": ("rho", "momentum", "epsilon"),
         "centered_rmsprop": ("rho", "momentum", "epsilon"), "adagrad_v2": ("epsilon",), "adadelta": ("rho", "epsilon"),
         "ftrl": ("l1", "l2", "l2_shrinkage", "lr_power"), "proximal_sgd": ("l1", "l2"),
         "proximal_adagrad": ("l1", "l2")}


def one_minus(beta: float) -> float:
    """1 - beta in float32, as TF1's kernels take it (Keras' Adam rounds 1 - beta taken in float64)."""
    return float(np.float32(1) - np.float32(beta))


@dataclasses.dataclass(frozen=True)
class Rule:
    """One side's optimizer: its rule (a key of SLOTS; "" when the harness does not know it), the
    side whose parameterisation of the slots it uses ('tf1' or 'keras'), its hyper-parameters, and the
    optimizer's class (for the report)."""
    rule: str
    side: str
    beta1: float = 0.0
    beta2: float = 0.0
    epsilon: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False
    rho: float = 0.0
    l1: float = 0.0
    l2: float = 0.0
    l2_shrinkage: float = 0.0
    lr_power: float = 0.0
    beta: float = 0.0          # Keras Ftrl's beta (added to l2 as beta / (2 lr))
    epsilon_outside: bool = False  # RMSProp's epsilon added after the root (a port's mistake: compare.causes)
    label: str = ""

    @property
    def known(self) -> bool:
        return bool(self.rule)

    @property
    def slots(self) -> tuple[str, ...]:
        slots = SLOTS[self.side].get(self.rule, ())
        if self.side == "keras" and self.rule in ("rmsprop", "centered_rmsprop") and not self.momentum:
            return slots[:-1]  # Keras' RMSprop keeps a momentum slot only with momentum > 0
        return slots

    def hyper(self) -> dict[str, float]:
        """The hyper-parameters the rule uses, by name (the configuration check compares them)."""
        names = {"sgd": (), "momentum": ("momentum",), "adam": ("beta1", "beta2", "epsilon"),
                 "rmsprop": ("rho", "momentum", "epsilon"), "centered_rmsprop": ("rho", "momentum", "epsilon"),
                 "adagrad": ("epsilon",), "adagrad_v2": ("epsilon",), "adadelta": ("rho", "epsilon"),
                 "ftrl": ("l1", "l2", "l2_shrinkage", "lr_power", "beta"), "proximal_sgd": ("l1", "l2"),
                 "proximal_adagrad": ("l1", "l2")}.get(self.rule, ())
        return {n: float(getattr(self, n)) for n in names}

    def describe(self) -> str:
        if not self.known:
            return f"{self.label or 'an optimizer'} (a rule the harness does not know)"
        if self.rule == "adam":
            return f"Adam (beta1 {self.beta1:g}, beta2 {self.beta2:g}, epsilon {self.epsilon:g})"
        if self.rule == "momentum":
            return f"momentum {self.momentum:g}{' (Nesterov)' if self.nesterov else ''}"
        if self.rule == "sgd":
            return "gradient descent"
        settings = ", ".join(f"{k} {v:g}" for k, v in self.hyper().items())
        return f"{self.rule.replace('_', ' ')}" + (f" ({settings})" if settings else "")


def constant(tensor: Any) -> Optional[float]:
    """The value of a Const tensor, or of a Cast or Identity of one; None for any other.  Read off the
    node, not by tf.get_static_value, which marks the tensor as one that may not be fed (the
    counterfactuals of compare.causes feed these)."""
    import tensorflow as tf
    op = tensor.op
    while op.type in ("Cast", "Identity") and op.inputs:
        op = op.inputs[0].op
    if op.type != "Const":
        return None
    value = np.asarray(tf.make_ndarray(op.get_attr("value"))).ravel()[0]
    return float(np.asarray(value, tensor.dtype.as_numpy_dtype))  # as the tensor holds it (a Cast's dtype)


def legacy_rule(update: Any, sess: Any) -> Rule:
    """The Rule of a TF1 update op (compare.tf1_graph.OptimizerUpdate), its constants read from the
    graph (they are Const ops; running them could run the control dependencies an optimizer built
    under, such as UPDATE_OPS), else evaluated."""
    values: dict[str, Any] = {}
    for n in HYPER.get(update.rule, ()):
        if n not in update.inputs:
            continue
        value = constant(update.inputs[n])
        values[n] = float(sess.run(update.inputs[n]) if value is None else value)
    label = update.op.type if update.op is not None else "no update op"
    return dataclasses.replace(Rule(update.rule, "tf1", nesterov=update.nesterov, label=label), **values)


def modern_rule(optimizer: Any) -> Rule:
    """The Rule of a Keras optimizer, from its public configuration; Rule("") for one the harness
    does not know (a class it has no rule for, or weight decay, AMSGrad, EMA of the weights)."""
    import keras
    config = optimizer.get_config()
    label = type(optimizer).__name__
    unknown = Rule("", "keras", label=label)
    if config.get("weight_decay") or config.get("use_ema") or config.get("amsgrad"):
        return unknown
    if isinstance(optimizer, (keras.optimizers.AdamW, keras.optimizers.Adamax, keras.optimizers.Nadam)):
        return unknown
    if isinstance(optimizer, keras.optimizers.Adam):
        return Rule("adam", "keras", beta1=config["beta_1"], beta2=config["beta_2"], epsilon=config["epsilon"],
                    label=label)
    if isinstance(optimizer, keras.optimizers.SGD):
        if config["momentum"]:
            return Rule("momentum", "keras", momentum=config["momentum"], nesterov=bool(config["nesterov"]),
                        label=label)
        return Rule("sgd", "keras", label=label)
    if isinstance(optimizer, keras.optimizers.RMSprop):
        return Rule("centered_rmsprop" if config["centered"] else "rmsprop", "keras", rho=config["rho"],
                    momentum=config["momentum"], epsilon=config["epsilon"], label=label)
    if isinstance(optimizer, keras.optimizers.Adagrad):
        return Rule("adagrad", "keras", epsilon=config["epsilon"], label=label)
    if isinstance(optimizer, keras.optimizers.Adadelta):
        return Rule("adadelta", "keras", rho=config["rho"], epsilon=config["epsilon"], label=label)
    if isinstance(optimizer, keras.optimizers.Ftrl):
        return Rule("ftrl", "keras", l1=config["l1_regularization_strength"],
                    l2=config["l2_regularization_strength"], lr_power=config["learning_rate_power"],
                    l2_shrinkage=config["l2_shrinkage_regularization_strength"], beta=config["beta"], label=label)
    return unknown


# ---------------------------------------------------------------------------------------------
# Slots across the two parameterisations

def modern_slots_from_legacy(rule: Rule, legacy_slots: Arrays, lr: float) -> Arrays:
    """The modern slots that continue a TF1 optimizer's state: Keras' momentum slot is -lr times TF1's
    accumulator (exact for the step about to run at rate lr); a slot both keep alike is copied."""
    if rule.side == "keras" and rule.rule == "momentum":
        return {"momentum": -np.float32(lr) * legacy_slots["accum"]}
    if rule.side == "keras" and rule.rule in KERAS_TO_TF1:
        return {k: legacy_slots[KERAS_TO_TF1[rule.rule][k]] for k in rule.slots}
    return dict(legacy_slots)


def legacy_slots_from_modern(rule: Rule, modern_slots: Arrays, lr: float) -> Arrays:
    """The inverse of `modern_slots_from_legacy`."""
    if rule.side == "keras" and rule.rule == "momentum":
        with np.errstate(invalid="ignore", divide="ignore"):  # a rate of 0: the accumulator is lost (NaN)
            return {"accum": modern_slots["momentum"] / -np.float32(lr)}
    if rule.side == "keras" and rule.rule in KERAS_TO_TF1:
        return {KERAS_TO_TF1[rule.rule][k]: v for k, v in modern_slots.items()}
    return dict(modern_slots)


def gradients_from_slots(rule: Rule, before: Arrays, after: Arrays, lr: float) -> np.ndarray:
    """The gradient one update applied, read back from the state before and after it (Adam's first
    moment, the momentum slot, or the weights of plain SGD): before/after {"w": weights, slot: value}."""
    if rule.rule == "adam":
        key = "m" if rule.side == "tf1" else "momentum"
        m0 = before[key].astype(np.float64)
        return m0 + (after[key].astype(np.float64) - m0) / one_minus(rule.beta1)
    if rule.rule == "momentum":
        key = "accum" if rule.side == "tf1" else "momentum"
        m0, m1 = before[key].astype(np.float64), after[key].astype(np.float64)
        return m1 - rule.momentum * m0 if rule.side == "tf1" else (rule.momentum * m0 - m1) / lr
    if rule.rule == "sgd":
        return (before["w"].astype(np.float64) - after["w"]) / lr
    raise ValueError(f"the gradient cannot be read back from the slots of {rule.describe()}")


# ---------------------------------------------------------------------------------------------
# One update, predicted in float64

def prox(p: np.ndarray, r: Any, l1: float, l2: float) -> np.ndarray:
    """The proximal step of TF1's proximal kernels: sign(p) max(|p| - r l1, 0) / (1 + r l2)."""
    shrunk = np.sign(p) * np.maximum(np.abs(p) - r * l1, 0) if l1 > 0 else p
    return shrunk / (1 + r * l2)


def predict(rule: Rule, before: Mapping[str, np.ndarray], g: np.ndarray, lr: float,
            powers: tuple[float, float] = (0.0, 0.0), keras_one_minus: bool = False) -> Arrays:
    """{"w": weights, slot: value} after one update of `rule` from `before` (same keys, the side's
    own slot names) on gradient `g` at rate `lr`; powers: (b1^t, b2^t) as this side computes them
    (Adam).  float64.  Keras' slots are renamed to TF1's for the formulas and back."""
    rename = KERAS_TO_TF1.get(rule.rule, {}) if rule.side == "keras" else {}
    b = {rename.get(k, k): np.asarray(v, np.float64) for k, v in before.items()}
    after = predict_tf1_names(rule, b, np.asarray(g, np.float64), lr, powers, keras_one_minus)
    back = {v: k for k, v in rename.items()}
    return {back.get(k, k): v for k, v in after.items()}


def predict_tf1_names(rule: Rule, b: Arrays, g: np.ndarray, lr: float, powers: tuple[float, float],
                      keras_one_minus: bool = False) -> Arrays:
    """`predict` with the slots in TF1's names (Keras' SGD momentum keeps its own `momentum`).
    keras_one_minus: Adam's 1 - beta as Keras' own update_step takes it (1 - beta in float64, then
    float32: 0.001 for beta 0.999) rather than as TF1's kernel (1 - 0.999f = 0.00099998713)."""
    w, name, side = b["w"], rule.rule, rule.side
    if name == "sgd":
        return {"w": w - lr * g}
    if name == "momentum" and side == "tf1":
        a = rule.momentum * b["accum"] + g
        return {"w": w - lr * (g + rule.momentum * a) if rule.nesterov else w - lr * a, "accum": a}
    if name == "momentum":
        m = rule.momentum * b["momentum"] - lr * g
        return {"w": w + (rule.momentum * m - lr * g if rule.nesterov else m), "momentum": m}
    if name == "adam":
        c1, c2 = ((float(np.float32(1 - rule.beta1)), float(np.float32(1 - rule.beta2))) if keras_one_minus
                  else (one_minus(rule.beta1), one_minus(rule.beta2)))
        m = b["m"] + (g - b["m"]) * c1
        v = b["v"] + (np.square(g) - b["v"]) * c2
        lr_t = lr * np.sqrt(1 - powers[1]) / (1 - powers[0])
        return {"w": w - lr_t * m / (np.sqrt(v) + rule.epsilon), "m": m, "v": v}
    if name in ("rmsprop", "centered_rmsprop"):
        return rmsprop(rule, b, g, lr)
    if name in ("adagrad", "adagrad_v2"):
        acc = b["accum"] + np.square(g)
        root = np.sqrt(acc + rule.epsilon) if side == "keras" else np.sqrt(acc) + rule.epsilon
        return {"w": w - lr * g / root, "accum": acc}
    if name == "adadelta":
        acc = rule.rho * b["accum"] + (1 - rule.rho) * np.square(g)
        u = np.sqrt(b["accum_update"] + rule.epsilon) / np.sqrt(acc + rule.epsilon) * g
        up = rule.rho * b["accum_update"] + (1 - rule.rho) * np.square(u)
        return {"w": w - lr * u, "accum": acc, "accum_update": up}
    if name == "ftrl":
        return ftrl(rule, b, g, lr)
    if name == "proximal_sgd":
        return {"w": prox(w - lr * g, lr, rule.l1, rule.l2)}
    if name == "proximal_adagrad":
        acc = b["accum"] + np.square(g)
        r = lr / np.sqrt(acc)
        return {"w": prox(w - r * g, r, rule.l1, rule.l2), "accum": acc}
    raise ValueError(f"no prediction for {rule.describe()}")


def rmsprop(rule: Rule, b: Arrays, g: np.ndarray, lr: float) -> Arrays:
    """RMSProp, plain or centered, with momentum (TF1's slot names)."""
    out = {"ms": b["ms"] + (np.square(g) - b["ms"]) * (1 - rule.rho)}
    denominator = out["ms"] + rule.epsilon
    if rule.rule == "centered_rmsprop":
        out["mg"] = b["mg"] + (g - b["mg"]) * (1 - rule.rho)
        denominator = denominator - np.square(out["mg"])
    increment = (lr * g / (np.sqrt(denominator - rule.epsilon) + rule.epsilon) if rule.epsilon_outside
                 else lr * g / np.sqrt(denominator))
    if rule.side == "tf1" or rule.momentum > 0:  # Keras keeps no momentum slot without momentum
        out["mom"] = rule.momentum * b["mom"] + increment
        increment = out["mom"]
    out["w"] = b["w"] - increment
    return out


def ftrl(rule: Rule, b: Arrays, g: np.ndarray, lr: float) -> Arrays:
    """FTRL-proximal, TF1's kernel or Keras' update_step (which adds beta / (2 lr) to l2)."""
    tf1 = rule.side == "tf1"
    w, acc, p = b["w"], b["accum"], -rule.lr_power
    new_acc = acc + np.square(g)
    linear = b["linear"] + g + 2 * rule.l2_shrinkage * w - (new_acc ** p - acc ** p) / lr * w
    l2 = rule.l2 + (0.0 if tf1 else rule.beta / (2 * lr))
    quadratic = new_acc ** p / lr + 2 * l2
    w_new = np.where(np.abs(linear) > rule.l1, (np.sign(linear) * rule.l1 - linear) / quadratic, 0.0)
    return {"w": w_new, "accum": new_acc, "linear": linear}


def update_errors(label: str, rule: Rule, before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                  grad: Any, lr: float, powers: tuple[float, float], tolerance: float) -> list[TensorError]:
    """[errors] of one variable's update on one side against `rule`: the weights and every slot.

    before/after: {"w": weights, slot: value} of the variable (numpy, float32); grad: the gradient
    this side's update received; lr: its rate; powers: (b1^t, b2^t) as this side computes them (Adam).
    Each error is the change of a tensor (after - before) against the predicted change, relative to
    the predicted change's size, with a floor in the same units: the ulps of the stored tensor before
    and after, and a few roundings of the change (TF's kernels compute in float32).  `tolerance` (the
    relative tolerance the check applies) turns a floor norm into the `floor` of tensor_error.  A Keras
    Adam is judged against whichever way of taking 1 - beta fits it: Keras' own update_step, or TF1's
    kernel (which a Keras Adam running `ResourceApplyAdam` follows).
    """
    variants = [False, True] if rule.side == "keras" and rule.rule == "adam" else [False]
    return min((variant_errors(label, rule, before, after, grad, lr, powers, v, tolerance) for v in variants),
               key=lambda errors: max(e.rel_l2 for e in errors))


def variant_errors(label: str, rule: Rule, before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray],
                   grad: Any, lr: float, powers: tuple[float, float], keras_one_minus: bool,
                   tolerance: float) -> list[TensorError]:
    """`update_errors` against one prediction (`predict` with `keras_one_minus`), made and measured a
    block of BLOCK elements at a time (every rule is elementwise): the float64 prediction of a block
    stays in cache, where whole-array float64 copies of ResNet-v2-50's weights and slots would not."""
    keys = ["w", *rule.slots]
    flat = {k: np.asarray(v).reshape(-1) for k, v in before.items()}
    done = {k: np.asarray(after[k]).reshape(-1) for k in keys}
    g = np.asarray(grad).reshape(-1)
    if any(done[k].shape != flat[k].shape for k in keys) or g.shape != flat["w"].shape:
        raise ValueError(f"{label}: the shapes of the state before, after and the gradient differ")
    sums = {k: Sums() for k in keys}
    for i in range(0, max(g.size, 1), BLOCK):
        part = {k: v[i:i + BLOCK] for k, v in flat.items()}
        predicted = predict(rule, part, g[i:i + BLOCK], lr, powers, keras_one_minus)
        for k in keys:
            sums[k] = sums[k].add(Sums.over(done[k][i:i + BLOCK], np.asarray(predicted[k]), offset=part[k],
                                            spacings=True))
    errors = []
    for k in keys:
        s = sums[k]
        floor = math.sqrt(s.spacing2) + 4 * math.sqrt(s.ref_spacing2) + 8 * EPS32 * math.sqrt(s.ref2)
        errors.append(errors_of(f"{label} {'update' if k == 'w' else k}", s, floor / tolerance))
    return errors


def readback_floor(rule: Rule, before: Arrays, after: Arrays, lr: float) -> float:
    """The norm of the float32 error of `gradients_from_slots` (ulps of what it subtracts)."""
    if rule.rule == "adam":
        return float((np.linalg.norm(np.spacing(np.abs(after["m"])))
                      + np.linalg.norm(np.spacing(np.abs(before["m"])))) / one_minus(rule.beta1))
    key = {"momentum": "accum" if rule.side == "tf1" else "momentum", "sgd": "w"}[rule.rule]
    scale = 1.0 if (rule.rule == "momentum" and rule.side == "tf1") else 1.0 / lr
    return float((np.linalg.norm(np.spacing(np.abs(after[key]))) + np.linalg.norm(np.spacing(np.abs(before[key]))))
                 * scale)


def same_rule(legacy: Rule, modern: Rule) -> bool:
    """Whether the two rules are the same update (hyper-parameters aside)."""
    return legacy.known and modern.known and legacy.rule == modern.rule and legacy.nesterov == modern.nesterov


def pair_slots(legacy: Mapping[str, np.ndarray], modern: Mapping[str, np.ndarray],
               close: Callable[[np.ndarray, np.ndarray], bool]) -> Optional[dict[str, str]]:
    """{modern slot: legacy slot} pairing each modern slot with a legacy slot of its shape whose value
    is `close` (a pairing the harness finds by value where it knows neither side's names), or None."""
    import itertools
    names_m, names_l = list(modern), list(legacy)
    if len(names_m) != len(names_l):
        return None
    for order in itertools.permutations(names_l):
        if all(np.shape(modern[m]) == np.shape(legacy[l]) and close(modern[m], legacy[l])
               for m, l in zip(names_m, order)):
            return dict(zip(names_m, order))
    return None
