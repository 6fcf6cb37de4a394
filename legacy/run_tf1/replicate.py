"""`tf.contrib.estimator.replicate_model_fn` and `TowerOptimizer`, as TF 1.5-1.12 documented them.

contrib's way to train an Estimator `model_fn` on several GPUs of one machine, gone with contrib and
kept in no maintained package.  What it did, and what this module does, on tensorflow-estimator
2.15.0::

    def model_fn(features, labels, mode, params):
        loss = ...
        optimizer = tf.contrib.estimator.TowerOptimizer(tf.train.MomentumOptimizer(lr, 0.9))
        return tf.estimator.EstimatorSpec(mode, loss=loss,
                                          train_op=optimizer.minimize(loss, tf.train.get_global_step()))

    estimator = tf.estimator.Estimator(tf.contrib.estimator.replicate_model_fn(model_fn), ...)

- **Devices**: `devices`, else every local GPU (`device_lib.list_local_devices()`), else the CPU.
  Variables live on one device, shared by every tower: the GPU where there is exactly one, else
  `/CPU:0`; the losses are aggregated there too.
- **The batch**: features and labels (tensors, or dicts of them) are cut by `tf.split` into equal
  shards along the rows, one per tower (name scope `split_inputs`); the batch must divide evenly.
- **Towers**: the `model_fn` is called once per device, the first tower in the caller's name scope
  (its names are the names a one-device run has), tower i > 0 in `tower_i`, every tower after the
  first reusing the variables (`variable_scope('', reuse=True)`), each tower's ops on its device.
- **Losses** (`loss_reduction`): `SUM` (the default) adds the towers' losses; any other reduction
  divides each tower's loss by the number of towers first (`averaged_loss`), so that their sum is
  their mean.  The spec's loss is that sum (`loss`, on the aggregation device).
- **Gradients**: `TowerOptimizer.compute_gradients` differentiates the tower's loss so scaled;
  `apply_gradients` collects each tower's gradients and, in the last tower, sums every variable's
  (`gradient_aggregating`, on the variable's device) and applies the sums once, in the first tower's
  scopes, then adds 1 to the global step.  The other towers' train ops are no-ops.  The last tower's
  train op is the spec's.  Several optimizers in one `model_fn` are gathered per optimizer class.
- **Evaluation**: the loss as in training; each metric's local variables (`METRIC_VARIABLES`) are
  summed into the first tower's after every update (and the other towers' zeroed), so that the
  first tower's metric values count every tower's rows.
- **Prediction**: predictions and export outputs concatenated across towers.
- Every other field of the spec is the first tower's.

A `model_fn` whose train op does not come from a `TowerOptimizer` is refused, as it was.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Optional

import tensorflow.compat.v1 as tf
from legacy.run_tf1.estimator import V1_API, load
from tensorflow.python.client import device_lib
from tensorflow.python.framework import device as framework_device

SUM = tf.losses.Reduction.SUM
PS_OPS = ("Variable", "VariableV2", "VarHandleOp")
TOWER_SCOPE = "tower_{}"


def local_devices(device_type: str) -> list[str]:
    """The names of the machine's devices of a type, as `device_lib.list_local_devices` lists them."""
    return [d.name for d in device_lib.list_local_devices() if d.device_type == device_type]


def fn_args(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The argument names of a function (a functools.partial's remaining ones, a callable object's)."""
    return tuple(inspect.signature(fn).parameters)


def replicate_model_fn(model_fn: Callable[..., Any], loss_reduction: str = SUM,
                       devices: Optional[Sequence[str]] = None) -> Callable[..., Any]:
    """A `model_fn` that runs `model_fn` once per device on its shard of the batch (module docstring).

    Args:
      model_fn: an Estimator `model_fn` whose train op comes from a `TowerOptimizer`.
      loss_reduction: `tf.losses.Reduction.SUM` (the towers' losses and gradients summed) or another
        reduction but NONE (each tower's loss divided by the number of towers first: their mean).
      devices: the devices to replicate over; None: every local GPU, or the CPU where there is none.
    Returns:
      The replicated `model_fn(features, labels, mode, params=None, config=None)`.
    Raises:
      ValueError: for `loss_reduction` NONE.
    """
    if loss_reduction == tf.losses.Reduction.NONE:
        raise ValueError(f"Tower losses need to be reduced in some way, yet {loss_reduction} reduction is specified.")
    devices = list(devices) if devices else (local_devices("GPU") or local_devices("CPU"))
    single_gpu = len(devices) == 1 and "GPU" in devices[0].upper()
    consolidation = "/GPU:0" if single_gpu else "/CPU:0"
    tf.logging.info(f"Replicating the `model_fn` across {devices}.  Variables are going to be placed on "
                    f"{[consolidation]}.  Consolidation device is going to be {consolidation}.")

    def replicated_model_fn(features: Any, labels: Any, mode: str, params: Any = None, config: Any = None) -> Any:
        keys = load(V1_API).ModeKeys
        feature_shards, label_shards = split_batch(features, labels, len(devices), consolidation)
        specs = tower_specs(model_fn, mode, feature_shards, label_shards, params, config, devices,
                            consolidation, loss_reduction)
        if mode == keys.TRAIN:
            return merged_spec(specs, mode, consolidation, train_op=specs[-1].train_op)
        if mode == keys.EVAL:
            return merged_spec(specs, mode, consolidation, eval_metric_ops=reduced_metrics(specs))
        return predict_spec(specs, consolidation)

    return replicated_model_fn


def split_batch(features: Any, labels: Any, shards: int, device: str) -> tuple[list[Any], Optional[list[Any]]]:
    """Features and labels (tensors or dicts of them), each cut by `tf.split` into `shards` along the rows."""
    def split(value: Any) -> list[Any]:
        if isinstance(value, dict):
            parts: list[dict[str, Any]] = [{} for _ in range(shards)]
            for name, tensor in value.items():
                cut = (tf.sparse.split(sp_input=tensor, num_split=shards, axis=0)
                       if isinstance(tensor, tf.SparseTensor) else tf.split(tensor, shards))
                for part, piece in zip(parts, cut):
                    part[name] = piece
            return parts
        return tf.split(value, shards)

    with tf.name_scope("split_inputs"), tf.device(device):
        return split(features), (None if labels is None else split(labels))


def tower_specs(model_fn: Callable[..., Any], mode: str, features: Sequence[Any], labels: Optional[Sequence[Any]],
                params: Any, config: Any, devices: Sequence[str], ps_device: str, loss_reduction: str) -> list[Any]:
    """Each device's EstimatorSpec: `model_fn` on its shard, in its tower's scopes, its loss scaled."""
    spec_lib = load(V1_API)
    wanted = fn_args(model_fn)
    optional = {name: copy.deepcopy(value) for name, value in (("params", params), ("config", config))
                if name in wanted}
    state = GraphState.of(tf.get_default_graph())
    state.reduction, state.towers, state.used = loss_reduction, len(devices), False
    specs = []
    try:
        for i, device in enumerate(devices):
            with tf.variable_scope("", reuse=i > 0) as var_scope, \
                    tf.name_scope(TOWER_SCOPE.format(i) if i else "") as name_scope, \
                    state.tower(i, var_scope, name_scope), tf.device(device_setter(device, ps_device)):
                spec = model_fn(mode=mode, features=features[i],
                                labels=labels[i] if labels is not None else None, **optional)
                if spec.train_op is not None and not state.used:
                    raise ValueError("Please wrap optimizers with TowerOptimizer in order to use replicate_model_fn.")
                if spec.loss is not None:
                    spec = spec_lib.EstimatorSpec(**{**spec_fields(spec),
                                                     "loss": scale_loss(spec.loss, loss_reduction, len(devices))})
                specs.append(spec)
    finally:
        GraphState.clear(tf.get_default_graph())
    return specs


def device_setter(worker_device: str, ps_device: str) -> Callable[[Any], str]:
    """Variables on `ps_device`, every other op on `worker_device` (a device the op names itself wins)."""
    def choose(op: Any) -> str:
        current = framework_device.DeviceSpec.from_string(op.device or "")
        target = ps_device if op.node_def.op in PS_OPS else worker_device
        spec = framework_device.DeviceSpec.from_string(target or "")
        return spec.make_merged_spec(current).to_string()
    return choose


def scale_loss(loss: Any, loss_reduction: str, towers: int) -> Any:
    """The tower's loss as the towers' losses are summed: itself for SUM, else divided by the tower count."""
    if loss is None or loss_reduction == SUM:
        return loss
    return tf.div(loss, 1.0 * towers, name="averaged_loss")


def spec_fields(spec: Any) -> dict[str, Any]:
    """An EstimatorSpec's fields by name."""
    return {name: getattr(spec, name) for name in spec._fields}


def sum_on_device(values: Sequence[Any], device: str, name: Optional[str] = None) -> Any:
    """The sum of the towers' tensors (or IndexedSlices, concatenated) on `device`."""
    with tf.device(device):
        if isinstance(values[0], tf.IndexedSlices):
            return tf.IndexedSlices(tf.concat([v.values for v in values], 0), tf.concat([v.indices for v in values], 0),
                                    values[0].dense_shape)
        return tf.add_n(list(values), name=name)


def merged_spec(specs: Sequence[Any], mode: str, device: str, **fields: Any) -> Any:
    """The first tower's spec with the towers' summed loss and `fields` in place."""
    merged = {**spec_fields(specs[0]), "mode": mode, **fields}
    merged["loss"] = sum_on_device([s.loss for s in specs], device, "loss")
    return load(V1_API).EstimatorSpec(**merged)


def reduced_metrics(specs: Sequence[Any]) -> dict[str, Any]:
    """The first tower's metrics, each updated by every tower's update and then the metric variables'
    reduction (`reduce_metric_variables`)."""
    updates = [update for spec in specs for _, update in (spec.eval_metric_ops or {}).values()]
    with tf.control_dependencies(updates):
        reduced = reduce_metric_variables(len(specs))
    return {name: (value, reduced) for name, (value, _) in (specs[0].eval_metric_ops or {}).items()}


def reduce_metric_variables(towers: int) -> Any:
    """Every tower's metric variables added into the first tower's, and zeroed (so that running it
    again adds nothing twice).  The towers made their metrics in the same order, so tower i's k-th
    variable is `METRIC_VARIABLES[k + i * per_tower]`."""
    if towers == 1:
        return tf.no_op(name="no_eval_metric_reduction")
    variables = tf.get_collection(tf.GraphKeys.METRIC_VARIABLES)
    if len(variables) % towers:
        raise ValueError(f"Different `EstimatorSpec.eval_metric_ops` across `model_fn()` calls. Expected a multiple "
                         f"of {towers} local variables, but got {len(variables)} instead.")
    per_tower = len(variables) // towers
    ops = []
    for k in range(per_tower):
        replicas = variables[k + per_tower::per_tower]
        added = tf.assign_add(variables[k], tf.add_n(replicas))
        with tf.control_dependencies([added]):
            ops += [tf.assign(r, tf.zeros_like(r)) for r in replicas]
    return tf.group(*ops)


def predict_spec(specs: Sequence[Any], device: str) -> Any:
    """The first tower's spec with every tower's predictions and export outputs concatenated."""
    export = load(f"{V1_API}.export")
    with tf.device(device):
        predictions = concat_dicts([s.predictions for s in specs])
        outputs: dict[str, Any] = {}
        for name, per_tower in gather([s.export_outputs for s in specs]).items():
            first = per_tower[0]
            if isinstance(first, export.PredictOutput):
                outputs[name] = export.PredictOutput(concat_dicts([o.outputs for o in per_tower]))
            elif isinstance(first, export.RegressionOutput):
                outputs[name] = export.RegressionOutput(tf.concat([o.value for o in per_tower], 0))
            elif isinstance(first, export.ClassificationOutput):
                scores = tf.concat([o.scores for o in per_tower], 0) if first.scores is not None else None
                classes = tf.stack([o.classes for o in per_tower], 0) if first.classes is not None else None
                outputs[name] = export.ClassificationOutput(scores=scores, classes=classes)
    return load(V1_API).EstimatorSpec(**{**spec_fields(specs[0]), "predictions": predictions,
                                         "export_outputs": outputs})


def gather(dicts: Sequence[Optional[dict[str, Any]]]) -> dict[str, list[Any]]:
    """{key: [each dict's value]} over the dicts given (None skipped)."""
    out: dict[str, list[Any]] = {}
    for d in dicts:
        for key, value in (d or {}).items():
            out.setdefault(key, []).append(value)
    return out


def concat_dicts(dicts: Sequence[Any]) -> Any:
    """Per key, the towers' tensors concatenated along the rows (a single tensor per tower: concatenated)."""
    if dicts and not isinstance(dicts[0], dict):
        return tf.concat(list(dicts), 0)
    return {name: tf.concat(tensors, 0, name=name) for name, tensors in gather(dicts).items()}


# ---------------------------------------------------------------------------------------------
# The optimizer every tower calls

@dataclasses.dataclass
class GraphState:
    """What the towers of one replicated `model_fn` call share while it builds them (one per graph)."""
    reduction: str = SUM
    towers: int = 0
    tower_id: int = 0
    scopes: tuple[Any, str] = (None, "")
    used: bool = False
    gathered: dict[type, list[tuple[Any, Any]]] = dataclasses.field(default_factory=dict)
    order: list[type] = dataclasses.field(default_factory=list)

    _graphs: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, graph: Any) -> GraphState:
        if graph not in cls._graphs:
            cls._graphs[graph] = cls()
        return cls._graphs[graph]

    @classmethod
    def clear(cls, graph: Any) -> None:
        cls._graphs.pop(graph, None)

    @property
    def last_tower(self) -> bool:
        return self.tower_id == self.towers - 1

    @contextlib.contextmanager
    def tower(self, tower_id: int, var_scope: Any, name_scope: str) -> Iterator[None]:
        self.tower_id = tower_id
        if tower_id == 0:
            self.scopes = (var_scope, name_scope)
        yield


class TowerOptimizer(tf.train.Optimizer):
    """`tf.contrib.estimator.TowerOptimizer`: gathers every tower's gradients and applies their sums once,
    in the last tower (module docstring).  Wraps an optimizer, or a no-argument function that makes one."""

    def __init__(self, optimizer_or_optimizer_fn: Any):
        # The wrapped optimizer does the work; this one has no state of its own (no base __init__).
        self._optimizer_or_optimizer_fn = optimizer_or_optimizer_fn

    @staticmethod
    def has_been_used() -> bool:
        return GraphState.of(tf.get_default_graph()).used

    def _optimizer(self) -> Any:
        if not isinstance(self._optimizer_or_optimizer_fn, tf.train.Optimizer):
            self._optimizer_or_optimizer_fn = self._optimizer_or_optimizer_fn()
        GraphState.of(tf.get_default_graph()).used = True
        return self._optimizer_or_optimizer_fn

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer().get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer().get_slot_names(*args, **kwargs)

    def get_name(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer().get_name(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer().variables(*args, **kwargs)

    def compute_gradients(self, loss: Any, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's gradients of the tower's loss, scaled as the towers are reduced."""
        state = GraphState.of(tf.get_default_graph())
        return self._optimizer().compute_gradients(scale_loss(loss, state.reduction, state.towers), *args, **kwargs)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, **kwargs: Any) -> Any:
        """Collect the tower's gradients; in the last tower, apply every tower's sums (a no-op before)."""
        state = GraphState.of(tf.get_default_graph())
        optimizer = self._optimizer()
        kind = type(optimizer)
        if kind not in state.order:
            state.order.append(kind)
        state.gathered.setdefault(kind, []).extend(grads_and_vars)
        if not state.last_tower:
            return tf.no_op(name="train_op_placeholder")
        var_scope, name_scope = state.scopes
        with tf.variable_scope(var_scope), tf.name_scope(name_scope):
            return self._apply_gathered(state, optimizer, global_step, **kwargs)

    @staticmethod
    def _apply_gathered(state: GraphState, optimizer: Any, global_step: Any, **kwargs: Any) -> Any:
        per_variable: dict[Any, list[Any]] = {}
        for grad, var in state.gathered[type(optimizer)]:
            if grad is not None:
                per_variable.setdefault(var, []).append(grad)
        with tf.name_scope("gradient_aggregating"):
            summed = [(sum_on_device(grads, var.device), var) for var, grads in per_variable.items()]
        applied = [optimizer.apply_gradients(summed, **kwargs)]
        # Several optimizers in one model_fn: the global step moves after the last one only.
        if global_step is not None and type(optimizer) is state.order[-1]:
            with tf.control_dependencies(applied), tf.colocate_with(global_step):
                return tf.assign_add(global_step, 1)
        return tf.group(applied)
