"""The optimizers' update rules on each side, read from each side's own configuration.

TF1 (the kernels `tf.compat.v1.train` optimizers run; hyper-parameters read from the update op's
inputs in the graph) and Keras 3 (`update_step`; hyper-parameters from `optimizer.get_config()`),
t = the step's 1-based count:

    Adam      TF1 and Keras alike:  m += (g - m)(1 - b1);  v += (g^2 - v)(1 - b2)
              w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
              (TF1 keeps b^t as running products beta1_power, beta2_power; Keras computes b^t;
              TF1's kernel takes 1 - b in float32: 1 - 0.999f = 0.00099998713)
    momentum  TF1:    a = mom a + g;      w -= lr a          (nesterov: w -= lr (g + mom a))
              Keras:  m = mom m - lr g;   w += m             (nesterov: w += mom m - lr g)
              The two keep different slots: from the same history with a constant rate,
              m = -lr a; under a decaying rate they differ (TF1 applies today's rate to the whole
              accumulated velocity).  The harness converts the TF1 slot at each restart.
    sgd       both:   w -= lr g

Each side's update is judged against its own rule, from the slots it started from and ended with,
and the gradient it applied; gradients are compared across sides.  When a modern step does not return
its gradients, `gradients_from_slots` reads them back out of the update (exact enough from Adam's or
momentum's first slot; from the weights alone for plain SGD, to within a float32 ulp of w over lr).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from compare.report import EPS32, TensorError, tensor_error

Arrays = dict[str, np.ndarray]


def one_minus(beta: float) -> float:
    """1 - beta in float32, as TF1's kernels take it (Keras' Adam rounds 1 - beta taken in float64)."""
    return float(np.float32(1) - np.float32(beta))


@dataclasses.dataclass
class Rule:
    """One side's optimizer: rule 'adam', 'momentum' or 'sgd', its hyper-parameters, and whose
    parameterisation of the slots it uses ('tf1' or 'keras')."""
    rule: str
    side: str
    beta1: float = 0.0
    beta2: float = 0.0
    epsilon: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False

    @property
    def slots(self) -> tuple[str, ...]:
        return {"adam": ("m", "v"), "momentum": ("accum",) if self.side == "tf1" else ("momentum",),
                "sgd": ()}[self.rule]

    def describe(self) -> str:
        if self.rule == "adam":
            return f"Adam (beta1 {self.beta1:g}, beta2 {self.beta2:g}, epsilon {self.epsilon:g})"
        if self.rule == "momentum":
            return f"momentum {self.momentum:g}{' (Nesterov)' if self.nesterov else ''}"
        return "gradient descent"


def legacy_rule(update: Any, sess: Any) -> Rule:
    """The Rule of a TF1 update op (compare.tf1_graph.OptimizerUpdate), its constants read from the
    graph (they are Const ops; running them could run the control dependencies an optimizer built
    under, such as UPDATE_OPS), else evaluated."""
    import tensorflow as tf
    names = {"adam": ("beta1", "beta2", "epsilon"), "momentum": ("momentum",), "sgd": ()}[update.rule]
    values: dict[str, float] = {}
    for n in names:
        value = tf.get_static_value(update.inputs[n])
        values[n] = float(sess.run(update.inputs[n]) if value is None else value)
    return Rule(update.rule, "tf1", nesterov=update.nesterov, **values)


def modern_rule(optimizer: Any) -> Rule:
    """The Rule of a Keras optimizer, from its public configuration."""
    import keras
    config = optimizer.get_config()
    if isinstance(optimizer, keras.optimizers.Adam):
        if config.get("amsgrad"):
            raise TypeError("AMSGrad is not among the rules the harness knows")
        return Rule("adam", "keras", beta1=config["beta_1"], beta2=config["beta_2"], epsilon=config["epsilon"])
    if isinstance(optimizer, keras.optimizers.SGD):
        if config["momentum"]:
            return Rule("momentum", "keras", momentum=config["momentum"], nesterov=bool(config["nesterov"]))
        return Rule("sgd", "keras")
    raise TypeError(f"the harness knows Adam and SGD (with or without momentum), not {type(optimizer).__name__}")


def modern_slots_from_legacy(rule: Rule, legacy_slots: Arrays, lr: float) -> Arrays:
    """The modern slots that continue a TF1 optimizer's state: identical for Adam; Keras' momentum
    slot is -lr times TF1's accumulator (exact for the step about to run at rate lr)."""
    if rule.rule == "momentum":
        return {"momentum": -np.float32(lr) * legacy_slots["accum"]}
    return dict(legacy_slots)


def gradients_from_slots(rule: Rule, before: Arrays, after: Arrays, lr: float) -> np.ndarray:
    """The gradient one update applied, read back from the state before and after it:
    before/after: {"w": weights, slot name: slot} of one variable (float32 arrays)."""
    if rule.rule == "adam":
        m0 = before["m"].astype(np.float64)
        return m0 + (after["m"].astype(np.float64) - m0) / one_minus(rule.beta1)
    if rule.rule == "momentum":
        key = "accum" if rule.side == "tf1" else "momentum"
        m0, m1 = before[key].astype(np.float64), after[key].astype(np.float64)
        return m1 - rule.momentum * m0 if rule.side == "tf1" else (rule.momentum * m0 - m1) / lr
    return (before["w"].astype(np.float64) - after["w"]) / lr


def readback_floor(rule: Rule, before: Arrays, after: Arrays, lr: float) -> float:
    """The norm of the float32 error of `gradients_from_slots` (ulps of what it subtracts)."""
    if rule.rule == "adam":
        return float((np.linalg.norm(np.spacing(np.abs(after["m"]))) + np.linalg.norm(np.spacing(np.abs(before["m"]))))
                     / one_minus(rule.beta1))
    key = {"momentum": "accum" if rule.side == "tf1" else "momentum", "sgd": "w"}[rule.rule]
    scale = 1.0 if (rule.rule == "momentum" and rule.side == "tf1") else 1.0 / lr
    return float((np.linalg.norm(np.spacing(np.abs(after[key]))) + np.linalg.norm(np.spacing(np.abs(before[key]))))
                 * scale)


def update_errors(label: str, rule: Rule, before: Arrays, after: Arrays, grad: Any, lr: float,
                  powers: tuple[float, float], tolerance: float) -> list[TensorError]:
    """[errors] of one variable's update on one side against `rule`.

    before/after: {"w": weights, slot: value} of the variable (numpy, float32); grad: the gradient
    this side applied; lr: the rate it used; powers: (b1^t, b2^t) as this side computes them (Adam).
    Each error is relative to the update's own size, with a floor in the same units: one ulp of w
    (the stored weight) plus a few roundings of the update; for a slot, its own ulps plus what the
    gradient read back from the slots carries (`readback_floor`).  `tolerance` (the relative
    tolerance the check applies) turns a floor norm into the `floor` of tensor_error.
    """
    w0, w1 = before["w"], after["w"]
    update = np.subtract(w1, w0, dtype=np.float64)
    g = np.asarray(grad, np.float64)
    slot_errors = []
    if rule.rule == "adam":
        m1, v1 = after["m"].astype(np.float64), after["v"].astype(np.float64)
        lr_t = lr * np.sqrt(1 - powers[1]) / (1 - powers[0])
        predicted = -lr_t * m1 / (np.sqrt(v1) + rule.epsilon)
        v0 = before["v"].astype(np.float64)
        pred_v = v0 + (np.square(g) - v0) * one_minus(rule.beta2)
        dg = np.float32(2 * one_minus(rule.beta2) / one_minus(rule.beta1)) * (
            np.spacing(np.abs(after["m"])) + np.spacing(np.abs(before["m"]))) * np.abs(g, dtype=np.float32)
        floor = np.linalg.norm(dg) + 4 * np.linalg.norm(np.spacing(np.abs(pred_v.astype(np.float32))))
        slot_errors.append(tensor_error(f"{label} v", v1, pred_v, floor / tolerance))
    elif rule.rule == "momentum" and rule.side == "tf1":
        a0, a1 = before["accum"].astype(np.float64), after["accum"].astype(np.float64)
        pred_a = rule.momentum * a0 + g
        predicted = -lr * (g + rule.momentum * a1) if rule.nesterov else -lr * a1
        floor = 4 * np.linalg.norm(np.spacing(np.abs(pred_a.astype(np.float32))))
        slot_errors.append(tensor_error(f"{label} accumulator", a1, pred_a, floor / tolerance))
    elif rule.rule == "momentum":
        m0, m1 = before["momentum"].astype(np.float64), after["momentum"].astype(np.float64)
        pred_m = rule.momentum * m0 - lr * g
        predicted = rule.momentum * m1 - lr * g if rule.nesterov else m1
        floor = 4 * np.linalg.norm(np.spacing(np.abs(pred_m.astype(np.float32))))
        slot_errors.append(tensor_error(f"{label} momentum", m1, pred_m, floor / tolerance))
    else:
        predicted = -lr * g
    floor = np.linalg.norm(np.spacing(np.abs(w0))) + 8 * EPS32 * np.linalg.norm(predicted)
    return [tensor_error(f"{label} update", update, predicted, floor / tolerance)] + slot_errors
