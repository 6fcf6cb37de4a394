"""tf.contrib on TF 2.21: the maintained home of each contrib module, and one line for a name without one.

`CONTRIB_HOMES` says where each `tf.contrib.<module>`'s names live now (tf-slim for `slim`, `layers`,
`framework`, `losses`, `metrics`, `training`; `tf.compat.v1.data` for `data`; ...), searched in order;
`ContribTree` serves them as the attribute `tf.contrib` and as importable modules; a name without a
home raises `ContribAttributeError` / `ContribImportError`, whose message names it and says what to
do.  `V1_ROUTES` and `REMOVED`: the `tf.compat.v1` names TF 2.21 routes elsewhere or removed.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, Union

from legacy import slim_compat  # noqa: F401  (before tf_slim, which the homes import: tf-slim on TF 2.21)
from legacy.run_tf1.estimator import CONTRIB_HINT, MOVED_TO_CORE, REPLICATED
from legacy.run_tf1.estimator import load as load_estimator
from legacy.run_tf1.distribute import CONTRIB_NAMES as DISTRIBUTE_NAMES


def batch_and_drop_remainder(batch_size: int) -> Callable[[Any], Any]:
    """`tf.contrib.data.batch_and_drop_remainder`: `dataset.batch(batch_size, drop_remainder=True)`."""
    return lambda dataset: dataset.batch(batch_size, drop_remainder=True)


def padded_batch_and_drop_remainder(batch_size: int, padded_shapes: Any,
                                    padding_values: Any = None) -> Callable[[Any], Any]:
    """`tf.contrib.data.padded_batch_and_drop_remainder`: `padded_batch(..., drop_remainder=True)`."""
    return lambda dataset: dataset.padded_batch(batch_size, padded_shapes, padding_values, drop_remainder=True)


def deprecated_flipped_softmax_cross_entropy_with_logits(logits: Any, labels: Any, dim: int = -1,
                                                         name: Any = None) -> Any:
    """`tf.contrib.nn.deprecated_flipped_softmax_cross_entropy_with_logits`: TF1's
    `tf.nn.softmax_cross_entropy_with_logits` with the logits first (its TF 1.0 argument order)."""
    import tensorflow.compat.v1 as tf1
    return tf1.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits, dim=dim, name=name)


def deprecated_flipped_sparse_softmax_cross_entropy_with_logits(logits: Any, labels: Any, name: Any = None) -> Any:
    """`tf.contrib.nn.deprecated_flipped_sparse_softmax_cross_entropy_with_logits`: the logits first."""
    import tensorflow.compat.v1 as tf1
    return tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits, name=name)


def deprecated_flipped_sigmoid_cross_entropy_with_logits(logits: Any, targets: Any, name: Any = None) -> Any:
    """`tf.contrib.nn.deprecated_flipped_sigmoid_cross_entropy_with_logits`: the logits first, the
    labels named `targets`."""
    import tensorflow.compat.v1 as tf1
    return tf1.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=logits, name=name)


class Names:
    """Some names of a module, the home of a contrib module's names in part: each imported (`load`) and
    looked up there at first use; any other name is not there."""

    def __init__(self, module: str, names: Sequence[str], load: Callable[[str], Any] = importlib.import_module):
        self.__name__, self.names, self.load = module, tuple(names), load

    def __getattr__(self, attr: str) -> Any:
        if attr in self.__dict__.get("names", ()):
            return getattr(self.load(self.__name__), attr)
        raise AttributeError(attr)

    def __dir__(self) -> list[str]:
        return sorted(self.names)


# tf.contrib.nn's names with an exact core equivalent (the rest of it has none).
NN_FLIPPED = types.SimpleNamespace(
    deprecated_flipped_softmax_cross_entropy_with_logits=deprecated_flipped_softmax_cross_entropy_with_logits,
    deprecated_flipped_sparse_softmax_cross_entropy_with_logits=(
        deprecated_flipped_sparse_softmax_cross_entropy_with_logits),
    deprecated_flipped_sigmoid_cross_entropy_with_logits=deprecated_flipped_sigmoid_cross_entropy_with_logits)

# The contrib.data transformations TF 1.10 replaced by a `drop_remainder` argument.
DATA_REMAINDER = types.SimpleNamespace(batch_and_drop_remainder=batch_and_drop_remainder,
                                       padded_batch_and_drop_remainder=padded_batch_and_drop_remainder)
RNN_CELLS = "tf_keras.api._v1.keras.__internal__.legacy.rnn_cell"  # tf.compat.v1.nn.rnn_cell under Keras 2

# tf.contrib.<module>: where its names live now, searched in order (the name is looked up lazily
# with getattr on each home).  contrib.losses is tf-slim's copy, which keeps contrib's argument
# order (logits first); tf.compat.v1.losses takes the labels first.
CONTRIB_HOMES: dict[str, tuple[Union[str, object], ...]] = {
    "slim": ("tf_slim",),
    "slim.nets": ("tf_slim.nets",),
    "slim.prefetch_queue": ("tf_slim.data.prefetch_queue",),
    "layers": ("tf_slim.layers", "tf_slim"),
    "framework": ("tf_slim", "tensorflow.compat.v1.train", "tensorflow.compat.v1"),
    "data": ("tensorflow.compat.v1.data", "tensorflow.compat.v1.data.experimental", DATA_REMAINDER),
    "losses": ("tf_slim.losses",),
    "metrics": ("tf_slim.metrics",),
    "training": ("tf_slim.training.training", "tf_slim.training.evaluation"),
    "rnn": (RNN_CELLS, "tensorflow.compat.v1.nn"),
    # contrib's strategies took num_gpus= and cross_tower_ops= (legacy/run_tf1/distribute.py), then core's names.
    "distribute": (Names("legacy.run_tf1.distribute", DISTRIBUTE_NAMES), "tensorflow.compat.v1.distribute",
                   "tensorflow.compat.v1.distribute.experimental"),
    # replicate_model_fn and TowerOptimizer (legacy/run_tf1/replicate.py), and the names TF 1.13 moved to
    # tf.estimator unchanged (legacy/run_tf1/estimator.py).
    "estimator": (Names("legacy.run_tf1.replicate", REPLICATED),
                  *(Names(home, names, load_estimator) for home, names in MOVED_TO_CORE.items())),
    "cluster_resolver": ("tensorflow.compat.v1.distribute.cluster_resolver",),
    "staging": ("tensorflow.python.ops.data_flow_ops",),
    "nccl": ("tensorflow.python.ops.nccl_ops",),
    "nn": (NN_FLIPPED,),
    # contrib.lookup re-exported core's lookup_ops (HashTable, KeyValueTensorInitializer, index_table_from_*,
    # the mutable tables), which TF 2.21 still has under these names.
    "lookup": ("tensorflow.python.ops.lookup_ops",),
    "util": ("tensorflow.python.framework.tensor_util", "tensorflow.compat.v1"),
    "compiler": (),
    "compiler.jit": ("tensorflow.python.compiler.xla.jit",),
    # contrib's own source layout, which some programs import directly: the same modules in tf-slim.
    "slim.python": (),
    "slim.python.slim": ("tf_slim",),
    "slim.python.slim.nets": ("tf_slim.nets",),
    "layers.python": (),
    "layers.python.layers": ("tf_slim.layers",),
    "framework.python": (),
    "framework.python.ops": ("tf_slim.ops",),
    "framework.python.framework": ("tensorflow.python.training",),  # checkpoint_utils, as core's
    "cluster_resolver.python": (),
    "cluster_resolver.python.training": ("tensorflow.compat.v1.distribute.cluster_resolver",),
    # contrib.tpu moved to core tf.tpu unchanged (TF 1.13); its TPUEstimator went with tf.estimator.
    "tpu": ("tensorflow.compat.v1.tpu",),
    "tpu.python": (),
    "tpu.python.tpu": ("tensorflow.python.tpu",),
}

# tf.contrib.<module> with no maintained home: what to do instead.
BY_HAND = "has no maintained home on TF 2.21"
CONTRIB_NO_HOME: dict[str, str] = {
    "learn": ("port this part to tf.estimator by hand, which runs here (tensorflow-estimator 2.15.0): "
              "Experiment and learn_runner are tf.estimator.train_and_evaluate with a TrainSpec and an EvalSpec, "
              "contrib.learn's RunConfig and Estimators tf.estimator's"),
    "opt": "use a tf.compat.v1.train optimizer, or port to a Keras optimizer",
    "seq2seq": "port this part to Keras layers by hand",
    "cudnn_rnn": "use tf.keras.layers.LSTM / GRU, which run cuDNN kernels themselves",
    "keras": "use tf.keras (Keras 3) or tf_keras (Keras 2)",
    "summary": "use tf.compat.v1.summary in the TF1 graph, tf.summary in TF2 code",
    "quantize": "use the TensorFlow Model Optimization Toolkit",
    "image": "use tf.image, or port the op by hand",
}

# tf.compat.v1 names TensorFlow routes to Keras 3, which lacks them: the program gets tf-keras's TF1
# ones, what they are under Keras 2 (`tf.compat.v1.layers` is legacy/slim_compat.py's).
V1_ROUTES: dict[str, str] = {
    "nn.rnn_cell": RNN_CELLS,
}

# tf.compat.v1 names TensorFlow 2.21 removed, with what to do (tf.estimator, removed in TF 2.16, is
# tensorflow-estimator's: legacy/run_tf1/estimator.py).
REMOVED: dict[str, str] = {}


class ContribAttributeError(AttributeError):
    """A `tf.contrib` name with no maintained home, reached as an attribute (one-line message)."""
    __module__ = "legacy.run_tf1"  # the same name in tracebacks under `python -m legacy.run_tf1`


ContribAttributeError.__module__ = "legacy.run_tf1"  # the package's public face: tracebacks name it so


class ContribImportError(ImportError):
    """A `tensorflow.contrib` module with no maintained home, imported (one-line message)."""
    __module__ = "legacy.run_tf1"


ContribImportError.__module__ = "legacy.run_tf1"  # the package's public face: tracebacks name it so


def no_home_message(name: str, home_modules: Sequence[str] = ()) -> str:
    """One line: `tf.contrib.<name>` has no home, and what to do."""
    top = name.split(".")[0]
    if top in CONTRIB_NO_HOME:
        return f"tf.contrib.{top} {BY_HAND}: {CONTRIB_NO_HOME[top]}"
    if home_modules:
        homes = " / ".join(home_modules)
        lack = "lacks" if len(home_modules) == 1 else "lack"
        hint = f" ({CONTRIB_HINT})" if top == "estimator" else ""
        return (f"tf.contrib.{name} {BY_HAND}: tf.contrib.{name.rpartition('.')[0]} maps to {homes}, "
                f"which {lack} it; replace it by hand{hint}")
    return f"tf.contrib.{name} {BY_HAND}: replace it by hand (TF 2.21 ships no tf.contrib)"


@functools.lru_cache(maxsize=None)
def import_dotted(path: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module {parts[0]}")


def home_label(home: Union[str, object]) -> str:
    """A home's name for messages: its dotted path, a module's name, or `legacy.run_tf1` for the adapters
    defined here."""
    if isinstance(home, str):
        return home
    return home.__name__ if isinstance(home, (types.ModuleType, Names)) else "legacy.run_tf1"


class ContribModule(types.ModuleType):
    """`tensorflow.contrib[.<name>]`: resolves each attribute lazily from the homes of `name`.

    A package (it has `__path__`), so `from tensorflow.contrib import learn` reaches the finder and
    raises the one-line ContribImportError instead of Python's generic "cannot import name".
    """

    def __init__(self, tree: ContribTree, name: str, homes: tuple[Union[str, object], ...]) -> None:
        super().__init__("tensorflow.contrib" + (f".{name}" if name else ""))
        self.__path__: list[str] = []
        self._contrib = (tree, name, homes)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_contrib":
            raise AttributeError(attr)
        value = self.__dict__[attr] = self._contrib[0].resolve(self, attr)[0]
        return value

    def __dir__(self) -> list[str]:
        tree, name, homes = self._contrib
        names = set(super().__dir__()) | tree.children(name)
        for home in homes:
            with contextlib.suppress(ImportError, AttributeError):
                names |= set(dir(import_dotted(home) if isinstance(home, str) else home))
        return sorted(names)


class ContribTree:
    """The `tensorflow.contrib` modules of one environment; `installed`: each also in sys.modules."""

    def __init__(self) -> None:
        self.modules: dict[str, ContribModule] = {}
        self.installed = False

    def module(self, name: str) -> ContribModule:
        """The module for `tf.contrib.<name>` ('' for `tf.contrib`), made on first use."""
        if name not in self.modules:
            self.modules[name] = ContribModule(self, name, self._homes(name))
            if self.installed:
                sys.modules[self.modules[name].__name__] = self.modules[name]
        return self.modules[name]

    def _homes(self, name: str) -> tuple[Union[str, object], ...]:
        if not name or name in CONTRIB_HOMES:
            return CONTRIB_HOMES.get(name, ())
        parent, _, attr = name.rpartition(".")
        if not parent:
            raise ContribImportError(no_home_message(name), name=f"tensorflow.contrib.{name}")
        target = self.resolve(self.module(parent), attr)[0]
        if not isinstance(target, types.ModuleType):
            raise ContribImportError(f"tensorflow.contrib.{name} is not a module", name=f"tensorflow.contrib.{name}")
        return (target,)

    def children(self, name: str) -> set[str]:
        """The sub-modules `CONTRIB_HOMES` lists under `tf.contrib.<name>`."""
        prefix = f"{name}." if name else ""
        return {key[len(prefix):].split(".")[0] for key in CONTRIB_HOMES if key.startswith(prefix) and key != name}

    def resolve(self, module: ContribModule, attr: str) -> tuple[Any, str]:
        """(object, where it lives) for `module.attr`, or ContribAttributeError with one line."""
        _, name, homes = module._contrib
        full = f"{name}.{attr}" if name else attr
        if full in CONTRIB_HOMES:
            return self.module(full), "/".join(home_label(h) for h in CONTRIB_HOMES[full])
        if not name:
            raise ContribAttributeError(no_home_message(attr))
        for home in homes:
            with contextlib.suppress(ImportError, AttributeError):
                target = import_dotted(home) if isinstance(home, str) else home
                return getattr(target, attr), f"{home_label(home)}.{attr}"
        raise ContribAttributeError(no_home_message(full, [home_label(h) for h in homes]))


