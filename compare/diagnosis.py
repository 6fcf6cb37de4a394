"""Where a FAIL first parts: the forward pass by layer, the gradients by layer, the training steps by
step and variable group.  It runs on a FAIL only (a run without one costs nothing more), and a
localisation that raises is one line of the diagnosis, never the FAIL's loss.

Layers.  The model's layers in the order its call runs them (recorded on one eager call: the model's
own sublayers, a block of layers counting as one), each paired with the TF1 name scope that computes
the same thing in tower 0 of the legacy graph: the common scope of the TF1 names of the layer's
variables, or, for a layer without variables (a pooling), the scope named like the layer beside its
neighbours' scopes (`ModernBuild.layer_scopes` names a pairing the harness cannot find).  In tower 0,
the scope's input is the one float tensor from outside it that depends on the fed batch, its output the
one it hands on toward the logits (of the layer's shape; the last built where several fit).  Each
layer is then given the legacy scope's own input and its output compared with the scope's: the error
the layer adds, not the error it inherits (the reference's intermediate values fed in, as Polygraphy
does between runtimes).  Its tolerance is MARGIN times the layer's own change under a 1-ulp change of
that input (its round-off floor, measured here), and never below the model tolerance.  The first
layer beyond its tolerance is where the two part.  `inherited`: the same output as the port computes
it from its own previous layers (how the difference grows, as CRADLE tracks it).  A dropout in
training mode is not compared (its mask is random; the dropout check judges it).

Gradients.  The per-variable errors of a gradient check, grouped by the layer that holds the variable
and taken from the loss backwards: an error in one layer's gradient flows into every layer before it,
so the first layer from the loss with a variable beyond its tolerance is where it starts.

Steps.  The first step, then the first variable group (learning rate, loss and gradients, weights,
slots, moving statistics, step counters) with an error beyond its tolerance (compare.checks.steps).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from compare import tf1_graph
from modern import keras_adapter
from compare.report import EPS32, MARGIN, Diagnosis, Part, Result, TensorError, tensor_error
from compare.sides import Sides


def guarded(result: Result, localise: Callable[[], Optional[Diagnosis]]) -> Result:
    """`result` with the diagnosis `localise()` gives, on a FAIL only; an exception while localising
    is the diagnosis' one line (the FAIL stands as it is)."""
    if result.status != "FAIL":
        return result
    try:
        result.diagnosis = localise()
    except Exception as error:  # noqa: BLE001 - a localisation that fails must not lose the FAIL
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        result.diagnosis = Diagnosis(f"not localised: {type(error).__name__}: {first}")
    return result


# ---------------------------------------------------------------------------------------------
# The model's layers and the TF1 scopes that compute them

@dataclasses.dataclass
class Layer:
    """One of the model's own layers, as one call ran it, and the TF1 scope paired with it."""
    layer: Any
    name: str
    variables: list[str]          # the TF1 names of its variables
    x: Any = None                 # its input and output on the recorded call (the port's own)
    y: Any = None
    scope: str = ""               # the TF1 name scope that computes it ("": none found)
    why: str = ""                 # why no scope, where none


def record_layers(sides: Sides, x: np.ndarray, training: bool) -> list[Layer]:
    """The model's direct sublayers in the order one eager call of the model on `x` runs them, each
    with the input and output of its first call (layers the call does not run are left out)."""
    modern = sides.modern
    by_id = {id(v): n for n, v in modern.names.items()}
    order: list[Layer] = []
    patched = []
    for layer in keras_adapter.all_layers(modern.model, recursive=False):
        original = layer.call
        entry = Layer(layer, layer.name, [by_id[id(v)] for v in layer.weights if id(v) in by_id])

        def call(*args: Any, __original: Any = original, __entry: Layer = entry, **kwargs: Any) -> Any:
            out = __original(*args, **kwargs)
            if __entry.y is None and args:
                __entry.x, __entry.y = args[0], out
                order.append(__entry)
            return out
        layer.call = call
        patched.append(layer)
    try:
        with modern.strategy.scope():
            modern.model(x, training=training)
    finally:
        for layer in patched:
            del layer.call
    return [e for e in order if hasattr(e.y, "shape") and hasattr(e.x, "shape")]


def common_scope(names: Sequence[str]) -> str:
    """The longest common '/'-prefix of TF1 variable names, the variable's own name dropped."""
    parts = [n.split("/")[:-1] for n in names]
    out = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        out.append(level[0])
    return "/".join(out)


def pair_scopes(layers: list[Layer], scope_names: set[str], named: Mapping[str, str]) -> None:
    """Each layer's TF1 scope: the adapter's name for it, else the common scope of its variables,
    else a scope in `scope_names` named like the layer (its '_' read as '/' too) beside the previous
    paired layer's scope (under the same parent) or anywhere where that one is unique."""
    parent = ""
    for entry in layers:
        if entry.name in named:
            entry.scope = named[entry.name]
        elif entry.variables:
            entry.scope = common_scope(entry.variables)
        else:
            wanted = {entry.name, entry.name.replace("_", "/")}
            beside = [s for s in scope_names if s.startswith(parent) and s[len(parent):] in wanted]
            anywhere = sorted(s for s in scope_names if any(s == w or s.endswith("/" + w) for w in wanted))
            entry.scope = beside[0] if beside else anywhere[0] if len(anywhere) == 1 else ""
            if not entry.scope:
                entry.why = f"no TF1 scope named {entry.name!r} (ModernBuild.layer_scopes can name it)"
        if entry.scope:
            parent = entry.scope.rsplit("/", 1)[0] + "/" if "/" in entry.scope else ""


@dataclasses.dataclass
class ScopeIO:
    """A TF1 scope's input and output tensors in tower 0, and the epsilons of its batch norms."""
    inputs: list[Any]
    outputs: list[Any]
    epsilons: list[float]
    inside: list[Any]   # every float tensor the scope computes from the batch (where a layer ends inside it)


def scope_pattern(scope: str) -> re.Pattern[str]:
    return re.compile(r"(^|/)" + re.escape(scope) + r"/")


def scope_io(scope: str, forward: set[Any], fed: set[Any], logits: Any) -> ScopeIO:
    """The float tensors that enter `scope`'s ops of `forward` (the tower's forward ops) from outside
    it and depend on the fed batch (`fed`: the ops that do), and those its ops hand on to forward ops
    outside it (or the logits), latest built last."""
    pattern = scope_pattern(scope)
    ops = {op for op in forward if pattern.search(op.name)}
    inputs, outputs, inside = {}, {}, {}
    for op in ops:
        for t in op.inputs:
            if t.op not in ops and t.op in fed and t.dtype.is_floating and t.graph.is_fetchable(t):
                inputs[t.name] = t
        for t in op.outputs:
            if not t.dtype.is_floating or op not in fed or not op.graph.is_fetchable(t):
                continue
            inside[t.name] = t
            if t is logits or any(c in forward and c not in ops for c in t.consumers()):
                outputs[t.name] = t
    order = lambda t: t.op._id  # noqa: E731 - creation order
    epsilons = [float(op.get_attr("epsilon")) for op in ops if op.type.startswith("FusedBatchNorm")]
    for op in ops:  # slim's batch norm under a fed is_training: its fused kernels inside a cond's branches
        if op.type in ("If", "StatelessIf"):
            fn = tf1_graph.functions_of(op.graph).get(op.get_attr("then_branch").name)
            epsilons += [n.attr["epsilon"].f for n in (fn.node_def if fn is not None else ())
                         if n.op.startswith("FusedBatchNorm")]
    return ScopeIO(sorted(inputs.values(), key=order), sorted(outputs.values(), key=order), epsilons,
                   sorted(inside.values(), key=order))


def fitting(tensors: Sequence[Any], values: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> Optional[Any]:
    """The last of `tensors` whose value has `shape`, else the last of those with its rank; None if none."""
    same = [t for t in tensors if values[t.name].shape == shape]
    rank = [t for t in tensors if values[t.name].ndim == len(shape)]
    return (same or rank or [None])[-1]


def scope_names(forward: set[Any]) -> set[str]:
    """Every name scope of the ops in `forward`, each suffix of it too (tower prefixes dropped)."""
    out = set()
    for op in forward:
        parts = op.name.split("/")[:-1]
        for i in range(len(parts)):
            for j in range(i + 1, len(parts) + 1):
                out.add("/".join(parts[i:j]))
    return out


def sensitivity(layer: Any, x: np.ndarray, training: bool, seed: int = 0) -> float:
    """The relative change of the layer's output under a 1-ulp change of every input element."""
    rng = np.random.RandomState(seed)
    moved = (x + np.sign(rng.randn(*x.shape)) * np.spacing(np.abs(x).astype(np.float32))).astype(x.dtype)
    a, b = (np.asarray(layer(v, training=training)) for v in (x, moved))
    return tensor_error("", b, a).rel_l2


@dataclasses.dataclass
class LayerRun:
    """The layers of one localisation, each with the legacy scope's input and output values."""
    layers: list[Layer]
    legacy_in: dict[str, np.ndarray]
    legacy_out: dict[str, np.ndarray]
    training: bool
    tolerance: float
    epsilons: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # the scopes' batch norms'
    # Per layer, the scope's tensors of its output's shape computed inside it: a Keras layer may end
    # before its scope does (slim's batch_norm applies its activation inside its scope).
    inside: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)


def layer_values(sides: Sides, batch: Any, training: bool) -> LayerRun:
    """Record the model's layers on tower 0's rows, pair them with TF1 scopes, and read each scope's
    input and output in tower 0 from the legacy program on `batch`."""
    legacy = sides.legacy
    view = legacy.view(batch, training)
    fed = view.fed
    rows = np.asarray(fed.towers.rows[0], int)
    layers = record_layers(sides, batch.x[rows], training)
    logits = view.tower_logits[0]
    forward = tf1_graph.ancestors([logits]) | {logits.op}
    starts = [t.op if isinstance(t, tf.Tensor) else getattr(t, "op", None) for t in fed.feed_dict]
    reached = tf1_graph.descendants([op for op in starts if op is not None])
    data_ops = forward & reached
    named = dict(sides.modern.build.layer_scopes or {})
    pair_scopes(layers, scope_names(forward), named)
    ios = {e.name: scope_io(e.scope, forward, data_ops, logits) for e in layers if e.scope}
    wanted = {t.name: t for io in ios.values() for t in io.inputs + io.outputs + io.inside}
    values = view.run(wanted) if wanted else {}
    legacy_in, legacy_out, inside = {}, {}, {}
    for e in layers:
        io = ios.get(e.name)
        if io is None:
            continue
        t_in = fitting(io.inputs, values, tuple(e.x.shape))
        t_out = fitting(io.outputs, values, tuple(e.y.shape))
        if t_in is None or t_out is None:
            e.why = f"the scope {e.scope} has no {'input' if t_in is None else 'output'} in tower 0"
            e.scope = ""
            continue
        legacy_in[e.name], legacy_out[e.name] = values[t_in.name], values[t_out.name]
        inside[e.name] = {t.name: values[t.name] for t in io.inside
                          if t is not t_out and values[t.name].shape == values[t_out.name].shape}
    return LayerRun(layers, legacy_in, legacy_out, training, sides.tol.model.rel_l2,
                    {name: io.epsilons for name, io in ios.items()}, inside)


def random_layer(layer: Any, training: bool) -> bool:
    return training and isinstance(layer, keras.layers.Dropout)


def isolated(run: LayerRun, e: Layer) -> tuple[float, str]:
    """The layer on the legacy scope's input against the scope's output (inf: shapes differ), or, where
    that differs beyond the tolerance, against the tensor inside the scope it is closest to (where the
    Keras layer ends before its scope: slim's batch_norm with its activation): (error, that tensor's
    name, or "")."""
    out = np.asarray(e.layer(run.legacy_in[e.name], training=run.training))
    want = run.legacy_out[e.name]
    if out.shape != want.shape:
        return float("inf"), ""
    error = tensor_error(e.name, out, want).rel_l2
    if error <= run.tolerance:
        return error, ""
    others = {n: tensor_error(n, out, v).rel_l2 for n, v in run.inside.get(e.name, {}).items()}
    best = min(others, key=lambda n: others[n], default="")
    return (others[best], best) if best and others[best] < error else (error, "")


def isolated_error(run: LayerRun, e: Layer) -> float:
    return isolated(run, e)[0]


def layer_parts(run: LayerRun) -> list[Part]:
    """Every paired layer's isolated error against its own tolerance, in call order."""
    parts = []
    for e in run.layers:
        label = f"{e.name} ({e.scope})" if e.scope else e.name
        if e.name not in run.legacy_in:
            parts.append(Part(label, float("nan"), float("nan"), note=e.why or "not paired"))
            continue
        if random_layer(e.layer, run.training):
            parts.append(Part(label, float("nan"), float("nan"), note="random in training mode: not compared"))
            continue
        x, want = run.legacy_in[e.name], run.legacy_out[e.name]
        tol = max(run.tolerance, MARGIN * sensitivity(e.layer, x, run.training), MARGIN * EPS32)
        error, inside = isolated(run, e)
        own, want = np.asarray(e.y), run.inside[e.name][inside] if inside else want
        inherited = tensor_error("", own, want).rel_l2 if own.shape == want.shape else float("inf")
        shape = np.shape(e.layer(x, training=run.training)) if not np.isfinite(error) else want.shape
        note = (f"output shape {tuple(shape)} vs legacy {want.shape}" if tuple(shape) != want.shape
                else f"the layer ends inside its scope, at {inside}" if inside else "")
        parts.append(Part(label, error, tol, inherited, note))
    return parts


def first_parting(parts: Sequence[Part]) -> Optional[int]:
    """The index of the first part beyond its tolerance (NaN-tolerance parts skipped)."""
    for i, p in enumerate(parts):
        if np.isnan(p.tolerance):
            continue
        if p.parts:
            return i
    return None


def localise_layers(sides: Sides, batch: Any, training: bool,
                    explain: Optional[Callable[[LayerRun, Layer, float], str]] = None,
                    outside: Optional[Callable[[], str]] = None) -> Diagnosis:
    """The forward pass, layer by layer (module docstring).  explain: (the run, the first parting
    layer, its tolerance) -> the catalogue's line for it (compare.causes.explain_layer); outside: the
    catalogue's line where every layer agrees (the loss after them); either None: no cause named."""
    state = sides.modern.state_snapshot()
    try:
        run = layer_values(sides, batch, training)
        parts = layer_parts(run)
        paired = sum(1 for p in parts if not np.isnan(p.tolerance))
        i = first_parting(parts)
        mode = "training" if training else "inference"
        if not paired:
            return Diagnosis(f"no layer of the model pairs with a TF1 scope in tower 0 ({len(parts)} layers; "
                             f"ModernBuild.layer_scopes can name them)", "", parts, "layers")
        if i is None:
            return Diagnosis(f"every one of {paired} paired layers agrees ({mode} mode, each on the legacy "
                             f"input): the difference is outside them (the loss, or a computation between layers)",
                             outside() if outside is not None else "", parts, "layers")
        p = parts[i]
        where = (f"first at layer {p.name}, {mode} mode, on the legacy program's input to it: "
                 f"{p.error:.3g} against its tolerance {p.tolerance:.3g}" + (f" ({p.note})" if p.note else "")
                 + f"; the {i} layer(s) before it agree")
        cause = explain(run, run.layers[i], p.tolerance) if explain is not None else ""
        return Diagnosis(where, cause, parts, "layers")
    finally:
        sides.modern.restore_snapshot(state)


# ---------------------------------------------------------------------------------------------
# Gradients by layer

def localise_gradients(sides: Sides, result: Result, explain: Callable[[str], str]) -> Diagnosis:
    """The gradient errors of `result` grouped by layer, from the loss backwards (module docstring):
    each error by the TF1 variable it is of (`TensorError.variable`; an error of none is no gradient);
    explain: the first parting layer -> the catalogue's line."""
    layers = record_layers(sides, sides.batch(rows=1, seed=5).x, False)
    by_variable: dict[str, str] = {n: e.name for e in layers for n in e.variables}
    tol = result.tolerance.rel_l2
    grouped: dict[str, list[TensorError]] = {}
    for error in result.errors:
        variable = error.variable
        if variable is not None and variable in sides.legacy.trainable:
            grouped.setdefault(by_variable.get(variable, variable.rsplit("/", 1)[0]), []).append(error)
    order = [e.name for e in layers if e.name in grouped] + [k for k in grouped if k not in by_variable.values()]
    parts, layer_of_part = [], []
    for layer in reversed(order):
        errors = grouped[layer]
        layer_of_part.append(layer)
        worst = max(errors, key=lambda e: e.rel_l2 / e.limit(tol) if e.limit(tol) > 0 else e.rel_l2)
        parts.append(Part(f"{layer} ({worst.variable})", worst.rel_l2, worst.limit(tol),
                          note=f"{len(errors)} variable(s)"))
    i = first_parting(parts)
    if i is None:
        return Diagnosis("no layer's gradients part", "", parts, "gradients by layer")
    p = parts[i]
    where = (f"first at layer {p.name}, from the loss backwards: {p.error:.3g} against {p.tolerance:.3g}; the "
             f"{i} layer(s) nearer the loss agree")
    return Diagnosis(where, explain(layer_of_part[i]), parts, "gradients by layer")
