"""What the harness finds by itself in a TF1 training graph, given the few tensors the adapter names.

Everything here reads the graph (ops, their inputs and attributes, collections); nothing changes an
op the program runs.  Where a value must be read out (a batch statistic, a dropout mask), the harness
adds an `Identity` tap beside the graph or feeds a tensor the program computes (TF1 lets a feed
replace any feedable tensor), so the program's own ops run as built.

    variables_by_name   every variable by its TF1 name; a tf.distribute variable (a MirroredStrategy's, one
                        component per replica) by its first component, each component's name naming it
    mirrors             the components of each such variable, and whether it is read as their aggregate
    model_variables     trainable variables and the moving statistics UPDATE_OPS moves
    optimizer_updates   the optimizer's update op of each variable: its rule (any tf.compat.v1.train
                        optimizer's kernel), its inputs (hyper-parameters, the gradient it receives),
                        its slots
    moving_updates      every `assign_moving_average`-shaped update of a variable: v -= (v - x)(1 - d),
                        with the statistic x it moves toward, 1 - d, and the tower it belongs to
    dropouts            each `tf.nn.dropout`: its uniform noise (feed it to impose a mask), rate,
                        input and output, and its tower
    running             the ops a fetch runs under a feed (a fed tensor's op and its inputs do not)
    logits_layer        the kernel and bias of the dense layer that computes the logits
    fan_ins             the contraction size of every forward matmul and convolution of tower 0
    StepFunction        a tensor as a function of the global step (a learning rate, a decay), evaluated
                        without the control dependencies it was built under
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import values as ds_values

from compare.optimizers import SLOTS, TF1_OPS

tf1 = tf.compat.v1

VARIABLE_OPS = ("VarHandleOp", "VariableV2", "Variable")
PASS_THROUGH = ("Identity", "ReadVariableOp", "Switch", "Enter", "RefIdentity", "RefSwitch", "RefEnter")


@dataclasses.dataclass
class OptimizerUpdate:
    """One variable's update op: its rule (compare.optimizers.TF1_OPS; "" for an update the harness
    does not know), `inputs` the op's inputs by their names in its OpDef (tensors), `slots` the slot
    variables by those names (m, v; accum; ms, mom; ...), `nesterov`."""
    rule: str
    op: Any
    variable: Any
    inputs: dict[str, Any]
    slots: dict[str, Any]
    nesterov: bool = False

    @property
    def grad(self) -> Any:
        """The gradient the update receives (after whatever the program does between averaging and
        applying: clipping, scaling)."""
        return self.inputs.get("grad", self.inputs.get("delta"))

    @property
    def rate(self) -> Any:
        return self.inputs.get("lr", self.inputs.get("alpha"))


@dataclasses.dataclass
class MovingUpdate:
    """v <- v - (v - value) * one_minus_decay, on `variable`, from tower `tower` (None: no tower)."""
    op: Any
    variable: Any
    value: Any
    one_minus_decay: Any
    tower: Optional[int]


@dataclasses.dataclass
class Dropout:
    """A `tf.nn.dropout`: keeps x / (1 - rate) where noise >= rate (noise uniform in [0, 1))."""
    noise: Any
    rate: Any
    input: Any
    output: Any
    tower: Optional[int]


@dataclasses.dataclass
class Mirror:
    """A tf.distribute variable of a TF1 graph (a MirroredStrategy's): its component variables, one per
    replica in replica order (the first named as the variable), and how it is read outside a replica:
    `on_read` (SyncOnRead: batch norm's moving statistics, each replica moving its own component) as
    the `aggregation` of its components, else (mirrored: every update applied to every component) as
    the first component."""
    components: list[Any]
    on_read: bool
    aggregation: Any  # tf.VariableAggregation


def primary(variable: Any) -> Any:
    """A tf.distribute variable's first component; any other variable itself.  (A distributed
    variable's own `.op` is not an op: outside its strategy, reading it may build a reduction.)"""
    return variable.values[0] if isinstance(variable, ds_values.DistributedValues) else variable


def graph_variables(graph: Any) -> list[Any]:
    """The graph's global and local variables as its collections hold them (distributed ones whole)."""
    return graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES) + graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES)


def variables_by_name(graph: Any) -> dict[str, Any]:
    """{TF1 name: variable}; a distributed variable is its first component, under its own name and
    under each component's (`conv1/kernel/replica_1` names `conv1/kernel`): an op that reads or
    updates any replica's copy is an op of the one variable."""
    out: dict[str, Any] = {}
    for v in graph_variables(graph):
        first = primary(v)
        for component in (v.values if isinstance(v, ds_values.DistributedValues) else (v,)):
            out.setdefault(component.op.name, first)
    return out


def mirrors(graph: Any) -> dict[str, Mirror]:
    """{TF1 name: Mirror} of the graph's tf.distribute variables with more than one component."""
    out = {}
    for v in graph_variables(graph):
        if isinstance(v, ds_values.DistributedValues) and len(v.values) > 1:
            on_read = isinstance(v, ds_values.SyncOnReadVariable)
            out[primary(v).op.name] = Mirror(list(v.values), on_read, getattr(v, "aggregation", None))
    return out


def variable_handle(tensor: Any) -> Any:
    """The variable op a resource handle, ref, or read of it comes from (through identities), or None."""
    seen = 0
    while tensor is not None and seen < 16:
        op = tensor.op
        if op.type in VARIABLE_OPS:
            return op
        if op.type not in PASS_THROUGH or not op.inputs:
            return None
        tensor, seen = op.inputs[0], seen + 1
    return None


def variable_of(tensor: Any, by_name: dict[str, Any]) -> Any:
    """The variable a resource handle, ref, or read of it refers to (through identities), or None; a
    replica's component of a distributed variable refers to that variable (`variables_by_name`)."""
    op = variable_handle(tensor)
    return by_name.get(op.name) if op is not None else None


def of_first_replica(tensor: Any, variable: Any) -> bool:
    """Whether `tensor` (an update's `var` input, a read) is of `variable` itself, not of another
    replica's component of it."""
    op = variable_handle(tensor)
    return op is not None and op.name == variable.op.name


def ancestors(tensors: Iterable[Any]) -> set[Any]:
    """Every op that `tensors` depend on, through data and control inputs (If/While count as one op)."""
    return _closure([t.op if hasattr(t, "op") else t for t in tensors],
                    lambda op: [*(i.op for i in op.inputs), *op.control_inputs])


# Ops that draw random numbers as an input pipeline uses them (crops, flips, colour jitter), not a
# shuffle (which the harness turns off) nor a variable's initialiser (no pipeline reaches one).
RANDOM_OPS = re.compile(r"^(Stateless)?(Random(?!Shuffle)|TruncatedNormal|Multinomial|ParameterizedTruncatedNormal)")


def called_functions(node_defs: Iterable[Any]) -> set[str]:
    """The names of the functions the nodes' attributes name (a dataset op's map function, say)."""
    names: set[str] = set()
    for node in node_defs:
        for value in node.attr.values():
            if value.HasField("func"):
                names.add(value.func.name)
            names.update(f.name for f in value.list.func)
    return names


def random_draws(graph_def: Any, nodes: Optional[Iterable[Any]] = None) -> list[str]:
    """The random op types in `nodes` (default: the GraphDef's) and in the functions of its library they
    call, transitively (a tf.data pipeline's map functions)."""
    nodes = list(graph_def.node if nodes is None else nodes)
    library = {f.signature.name: f for f in graph_def.library.function}
    todo, seen = called_functions(nodes), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        nodes += list(library[name].node_def)
        todo |= called_functions(library[name].node_def)
    return sorted({n.op for n in nodes if RANDOM_OPS.match(n.op)})


def pipeline_random_draws(graph: Any, sources: Iterable[Any]) -> list[str]:
    """The random op types a TF1 input pipeline runs: upstream of its `sources` and of every queue
    runner's enqueue ops, and in the functions those ops call (a tf.data pipeline's)."""
    enqueues = [op for runner in graph.get_collection(tf1.GraphKeys.QUEUE_RUNNERS) for op in runner.enqueue_ops]
    ops = ancestors([*sources, *enqueues])
    return random_draws(graph.as_graph_def(), [op.node_def for op in ops])


def descendants(ops: Iterable[Any]) -> set[Any]:
    """Every op that consumes the outputs of `ops`, transitively through data inputs (`ops` included)."""
    return _closure(list(ops), lambda op: [c for t in op.outputs for c in t.consumers()])


def logits_bias(logits: Any, by_name: dict[str, Any]) -> Optional[str]:
    """The name of the bias variable the logits add last (BiasAdd or Add of a vector variable), or None."""
    layer = logits_layer(logits, by_name)
    return layer[1] if layer is not None else None


def logits_layer(logits: Any, by_name: dict[str, Any]) -> Optional[tuple[str, str]]:
    """(kernel, bias): the names of the variables of the dense layer that computes the logits,
    x kernel + bias (a MatMul and a BiasAdd or Add of a vector variable); None where it is not one."""
    op = logits.op
    while op.type in ("Identity", "Reshape") and op.inputs:
        op = op.inputs[0].op
    if op.type not in ("BiasAdd", "Add", "AddV2"):
        return None
    bias = kernel = None
    for t in op.inputs:
        v = variable_of(t, by_name)
        if v is not None and v.shape.rank == 1:
            bias = v.op.name
        elif t.op.type == "MatMul" and not t.op.get_attr("transpose_b"):
            k = variable_of(t.op.inputs[1], by_name)
            kernel = k.op.name if k is not None and k.shape.rank == 2 else None
    return (kernel, bias) if kernel is not None and bias is not None else None


def running(tensors: Iterable[Any], fed: Iterable[Any]) -> set[Any]:
    """The ops that run when `tensors` are fetched with `fed` (tensors) in the feed: `ancestors`,
    stopping at a fed tensor's op, which does not run either (the feed replaces its output)."""
    stops = {getattr(t, "op", t) for t in fed}
    return _closure([t.op if hasattr(t, "op") else t for t in tensors],
                    lambda op: [] if op in stops else [*(i.op for i in op.inputs), *op.control_inputs]) - stops


def _closure(stack: list[Any], neighbours: Callable[[Any], list[Any]]) -> set[Any]:
    seen = set()
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(neighbours(op))
    return seen


class Towers:
    """Which tower an op belongs to: the one tower loss it is an ancestor of (None: none or several)."""

    def __init__(self, tower_losses: Sequence[Any]) -> None:
        self.sets = [ancestors([loss]) for loss in tower_losses]

    def of(self, op: Any) -> Optional[int]:
        owners = [i for i, s in enumerate(self.sets) if op in s]
        return owners[0] if len(owners) == 1 else None


def optimizer_updates(graph: Any, grads_and_vars: Sequence[tuple[Any, Any]]) -> dict[str, OptimizerUpdate]:
    """{variable name: OptimizerUpdate} for every variable of `grads_and_vars`: its `tf.compat.v1.train`
    optimizer's update op (any of compare.optimizers.TF1_OPS), or, for a variable no such op updates,
    an update of rule "" (its op the first op that assigns to it; no slots)."""
    by_name = variables_by_name(graph)
    wanted = {v.op.name for _, v in grads_and_vars}
    found: dict[str, OptimizerUpdate] = {}
    for op in graph.get_operations():
        kind = op.type[len("Resource"):] if op.type.startswith("Resource") else op.type
        if kind not in TF1_OPS:
            continue
        rule = TF1_OPS[kind]
        inputs = dict(zip([arg.name for arg in op.op_def.input_arg], op.inputs))
        variable = variable_of(inputs["var"], by_name)
        if variable is None or variable.op.name not in wanted or not of_first_replica(inputs["var"], variable):
            continue
        slots = {s: variable_of(inputs[s], by_name) for s in SLOTS["tf1"][rule]}
        nesterov = bool(op.node_def.attr["use_nesterov"].b) if "use_nesterov" in op.node_def.attr else False
        found[variable.op.name] = OptimizerUpdate(rule, op, variable, inputs, slots, nesterov)
    for _, variable in grads_and_vars:
        if variable.op.name not in found:
            found[variable.op.name] = OptimizerUpdate("", assigning_op(graph, variable, by_name), variable, {}, {})
    return found


def assigning_op(graph: Any, variable: Any, by_name: dict[str, Any]) -> Any:
    """The first op that writes `variable` (an Assign*, or an update kernel the harness does not know)."""
    for op in graph.get_operations():
        if op.type.startswith(("Assign", "ResourceApply", "Apply", "ResourceSparse", "Sparse")) and op.inputs \
                and variable_of(op.inputs[0], by_name) is variable:
            return op
    return None


def assign_sub_parts(op: Any, by_name: dict[str, Any]) -> Optional[tuple[Any, Any, Any]]:
    """For an op `v -= (v - value) * c` (AssignSubVariableOp / AssignSub), (v, value, c); else None."""
    if op.type not in ("AssignSubVariableOp", "AssignSub") or len(op.inputs) < 2:
        return None
    variable = variable_of(op.inputs[0], by_name)
    delta = op.inputs[1]
    if variable is None or delta.op.type != "Mul":
        return None
    a, b = delta.op.inputs
    for diff, factor in ((a, b), (b, a)):
        if diff.op.type == "Sub" and variable_of(diff.op.inputs[0], by_name) is variable:
            return variable, diff.op.inputs[1], factor
    return None


def moving_updates(graph: Any, tower_losses: Sequence[Any]) -> list[MovingUpdate]:
    """The `UPDATE_OPS` of the graph that move a variable toward a statistic (slim's and Keras 2's
    batch norm: `assign_moving_average`), each with its tower."""
    by_name = variables_by_name(graph)
    towers = Towers(tower_losses)
    out = []
    for item in graph.get_collection(tf1.GraphKeys.UPDATE_OPS):
        op = item if isinstance(item, tf.Operation) else item.op
        parts = assign_sub_parts(op, by_name)
        if parts is None:
            raise ValueError(f"UPDATE_OPS holds {op.name} ({op.type}), not a moving-average update "
                             f"v -= (v - x) * (1 - decay): the harness cannot predict it")
        variable, value, factor = parts
        out.append(MovingUpdate(op, variable, value, factor, towers.of(value.op)))
    return out


def shadow_update(graph: Any, shadow: Any) -> tuple[Any, Any, Any]:
    """The update op of a moving-average shadow variable: (op, value it averages, 1 - decay)."""
    by_name = variables_by_name(graph)
    for op in graph.get_operations():
        parts = assign_sub_parts(op, by_name)
        if parts is not None and parts[0] is shadow:
            return op, parts[1], parts[2]
    raise ValueError(f"no moving-average update of {shadow.op.name} in the graph")


def dropouts(graph: Any, tower_losses: Sequence[Any]) -> list[Dropout]:
    """Every `tf.nn.dropout` in the forward graph (gradients excluded), with its tower."""
    towers = Towers(tower_losses)
    out = []
    for op in graph.get_operations():
        if op.type != "GreaterEqual" or op.inputs[0].op.type != "RandomUniform":
            continue
        for select in op.outputs[0].consumers():
            if select.type not in ("SelectV2", "Select") or select.name.startswith("gradients"):
                continue
            scaled = select.inputs[1]
            if scaled.op.type not in ("RealDiv", "Mul"):
                continue
            out.append(Dropout(noise=op.inputs[0], rate=op.inputs[1], input=scaled.op.inputs[0],
                               output=select.outputs[0], tower=towers.of(select)))
    return out


def fan_ins(tower_loss: Any) -> list[int]:
    """The contraction size of each forward MatMul and Conv2D the loss depends on (one tower)."""
    sizes = []
    for op in ancestors([tower_loss]):
        if "gradients" in op.name.split("/")[0]:
            continue
        if op.type in ("MatMul", "BatchMatMulV2"):
            a = op.inputs[0].shape
            transpose = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
            k = a[-2] if transpose else a[-1]
            if k is not None:
                sizes.append(int(k))
        elif op.type in ("Conv2D", "DepthwiseConv2dNative"):
            h, w, c = op.inputs[1].shape[:3]
            if None not in (h, w, c):
                sizes.append(int(h * w * c) if op.type == "Conv2D" else int(h * w))
    return sizes


def model_variables(graph: Any, grads_and_vars: Sequence[tuple[Any, Any]],
                    updates: Sequence[MovingUpdate]) -> list[Any]:
    """The model's variables in creation order: the trained ones and those UPDATE_OPS moves."""
    names = {v.op.name for _, v in grads_and_vars} | {u.variable.op.name for u in updates}
    firsts = [primary(v) for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)]
    return [v for v in firsts if v.op.name in names]


_LIBRARIES: dict[tuple[int, int], dict[str, Any]] = {}


def functions_of(graph: Any) -> dict[str, Any]:
    """{name: FunctionDef} of the graph's function library (the branches of its `cond`s), read once
    per graph and size (serialising a ResNet graph takes a second)."""
    key = (id(graph), graph.version)
    if key not in _LIBRARIES:
        _LIBRARIES.clear()
        _LIBRARIES[key] = {fn.signature.name: fn for fn in graph.as_graph_def().library.function}
    return _LIBRARIES[key]


def batch_norm_epsilon(graph: Any, statistic: Any) -> Optional[float]:
    """The epsilon of the batch norm that computed `statistic` (a batch mean or variance that a
    moving update reads): the FusedBatchNorm op itself, or the one inside the `cond` (If) whose output
    it is, found in the graph's function library.  None when it is not a fused batch norm."""
    tensor = statistic
    for _ in range(8):
        op = tensor.op
        if op.type.startswith("FusedBatchNorm"):
            return float(op.get_attr("epsilon"))
        if op.type in ("If", "StatelessIf"):
            fn = functions_of(graph).get(op.get_attr("then_branch").name)
            if fn is None:
                return None
            eps = [n.attr["epsilon"].f for n in fn.node_def if n.op.startswith("FusedBatchNorm")]
            return float(eps[0]) if len(set(eps)) == 1 else None
        if op.type not in PASS_THROUGH + ("Merge",) or not op.inputs:
            return None
        tensor = op.inputs[0]
    return None


class StepFunction:
    """A scalar tensor of the graph as a function of the global step, evaluated without the control
    dependencies it was built under: running the tensor itself would also run them (an
    ExponentialMovingAverage applied under `control_dependencies([apply_gradients])` has a decay tensor
    whose evaluation trains a step).  Reads of the global step in its subgraph are fed the step given:
    in the program's own session when no op of that subgraph has a control input, else in a copy of
    the subgraph without them."""

    def __init__(self, graph: Any, tensor: Any, global_step: Any, sess: Any = None) -> None:
        step_name = global_step.op.name
        stops, keep, stack, controlled = [], {}, [tensor.op], False
        while stack:
            op = stack.pop()
            if op.name in keep:
                continue
            if op.type in ("ReadVariableOp", "Identity") and op.inputs and op.inputs[0].op.name == step_name:
                stops.append(op.outputs[0])
                continue
            if op.type in VARIABLE_OPS:
                raise ValueError(f"{tensor.name} reads the variable {op.name}, not only the global step")
            keep[op.name] = op
            controlled |= bool(op.control_inputs)
            stack.extend(i.op for i in op.inputs)
        if sess is not None and not controlled:
            self.sess, self.steps, self.out = sess, stops, tensor
        else:
            self.sess, self.steps, self.out = self.copy(graph, tensor, stops, keep)
        # The scalar constants the tensor is computed from (a schedule's base, period, decay, boundaries
        # and values), by name, in the graph it is evaluated in: what a counterfactual may feed.
        self.constants = {op.name: self.out.graph.get_tensor_by_name(op.outputs[0].name) for op in keep.values()
                          if op.type == "Const" and op.outputs[0].shape.num_elements() == 1
                          and (op.outputs[0].dtype.is_floating or op.outputs[0].dtype.is_integer)}
        self.cache: dict[float, float] = {}

    @staticmethod
    def copy(graph: Any, tensor: Any, stops: list[Any], keep: dict[str, Any]) -> tuple[Any, list[Any], Any]:
        """(session, step placeholders, output) of the subgraph `keep` imported without control inputs."""
        graph_def = tf1.GraphDef()
        for op in keep.values():
            node = graph_def.node.add()
            node.CopyFrom(op.node_def)
            node.ClearField("device")
            kept_inputs = [i for i in node.input if not i.startswith("^")]
            del node.input[:]
            node.input.extend(kept_inputs)
        graph_def.library.CopyFrom(graph.as_graph_def().library)
        graph_def.versions.CopyFrom(graph.graph_def_versions)
        copied = tf1.Graph()
        with copied.as_default():
            steps = [tf1.placeholder(t.dtype, t.shape) for t in stops]
            (out,) = tf1.import_graph_def(graph_def, input_map={t.name: p for t, p in zip(stops, steps)},
                                          return_elements=[tensor.name], name="")
        return tf1.Session(graph=copied), steps, out

    def __call__(self, step: float, changes: Optional[dict[str, float]] = None) -> float:
        """The tensor at `step`; changes: {constant's name: the value it is fed instead}."""
        if changes:
            return self.run(step, changes)
        if step not in self.cache:
            self.cache[step] = self.run(step, {})
        return self.cache[step]

    def value(self, name: str) -> float:
        """A constant's own value."""
        return float(np.asarray(self.sess.run(self.constants[name])).ravel()[0])

    def run(self, step: float, changes: dict[str, float]) -> float:
        feed = {p: np.asarray(step, p.dtype.as_numpy_dtype) for p in self.steps}
        for name, v in changes.items():
            t = self.constants[name]
            feed[t] = np.reshape(np.asarray(v, t.dtype.as_numpy_dtype), t.shape)
        return float(self.sess.run(self.out, feed))


# ---------------------------------------------------------------------------------------------
# A captured program's towers: where their rows come from, their logits

# The ops a tower's rows come from: a queue's dequeue, an iterator's get_next, a placeholder.
SOURCES = ("QueueDequeueV2", "QueueDequeueManyV2", "QueueDequeueUpToV2", "QueueDequeue", "QueueDequeueMany",
           "QueueDequeueUpTo", "IteratorGetNext", "Placeholder")
XENT = ("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")


def natural(name: str) -> list[Any]:
    """A name's sort key with its numbers as numbers (tower_2 before tower_10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def logits_of(loss: Any) -> Optional[Any]:
    """The logits a tower's loss is computed from: the first input of its softmax cross-entropy (back
    through the reshapes tf.nn.softmax_cross_entropy_with_logits wraps them in)."""
    for op in ancestors([loss]):
        if op.type in XENT and "gradients" not in op.name:
            logits = op.inputs[0]
            while logits.op.type in ("Reshape", "Identity") and logits.op.inputs[0].shape.rank == 2:
                logits = logits.op.inputs[0]
            return logits
    return None


def rows_slice(op: Any) -> bool:
    """Whether `op` is a slice of rows, `x[begin:end]` (a StridedSlice of the first axis alone, step 1)."""
    if op.type != "StridedSlice" or any(op.get_attr(m) for m in ("ellipsis_mask", "new_axis_mask",
                                                                   "shrink_axis_mask")):
        return False
    strides = tf.get_static_value(op.inputs[3])
    return strides is not None and list(np.ravel(strides)) == [1]


# Ops that take other rows than their input's, in an order or number of their own: a tower's rows cut
# by one of them are no tf.split part or slice of its source the harness could cut a batch into.
TAKES_ROWS = ("Gather", "GatherV2", "ResourceGather", "GatherNd", "Slice", "StridedSlice", "DynamicPartition",
              "Tile", "RandomShuffle", "Concat", "ConcatV2", "Pack", "Where")


def every_row(op: Any) -> bool:
    """Whether a slice takes every row of its input, in order (`x[:, 0]`, `x[..., :3]`,
    `tf.slice(x, [0, k], [-1, n])`): it cuts other axes only."""
    if op.type == "StridedSlice":
        if op.get_attr("ellipsis_mask") & 1:
            return True
        if op.get_attr("new_axis_mask") & 1 or op.get_attr("shrink_axis_mask") & 1:
            return False
        strides = tf.get_static_value(op.inputs[3])
        return bool(op.get_attr("begin_mask") & 1 and op.get_attr("end_mask") & 1) and strides is not None \
            and int(np.ravel(strides)[0]) == 1
    if op.type == "Slice":
        begin, size = tf.get_static_value(op.inputs[1]), tf.get_static_value(op.inputs[2])
        return begin is not None and size is not None and int(np.ravel(begin)[0]) == 0 \
            and int(np.ravel(size)[0]) == -1
    return False


class Uncut(Exception):
    """A tower's rows reach it through an op that takes rows of its own choosing (TAKES_ROWS)."""

    def __init__(self, op: Any):
        super().__init__(f"{op.type} {op.name}")
        self.op = op


def source_of(tensor: Any) -> tuple[Optional[Any], int, int, Optional[tuple[Any, Any]]]:
    """(the source output `tensor` derives from, the split part it takes, the number of parts, the
    bounds of the slice of rows it takes): walked back through single-input ops, tf.split and a
    slice of rows.  Uncut where the walk meets an op that takes rows of its own (a tf.gather, a
    tf.slice, a second slice of rows): the rows it takes are not known without running it."""
    part, parts, bounds, seen = 0, 1, None, 0
    while tensor is not None and seen < 64:
        op = tensor.op
        if op.type in SOURCES:
            return tensor, part, parts, bounds
        if op.type in ("Split", "SplitV"):
            part, parts = tensor.value_index, len(op.outputs)
            tensor = op.inputs[1] if op.type == "Split" else op.inputs[0]
        elif bounds is None and rows_slice(op):
            bounds, tensor = (op.inputs[1], op.inputs[2]), op.inputs[0]
        elif op.type in TAKES_ROWS and not every_row(op):
            raise Uncut(op)
        else:
            data = [i for i in op.inputs if i.dtype != tf.int32 or op.type in ("OneHot", "Cast", "Identity")]
            tensor = data[0] if data else None
        seen += 1
    return None, 0, 1, None
