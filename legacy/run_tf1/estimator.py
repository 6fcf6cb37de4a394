"""tf.estimator under the runner: tensorflow-estimator 2.15.0 under the names TF1 programs reach it by.

`legacy/estimator_compat.py` makes the released package import and train on TF 2.21; this module
says where each TF1 name of it lives:

    tf.estimator, tf.compat.v1.estimator        tensorflow_estimator._api.v1.estimator: the TF1 API,
                                                what `tf.estimator` was under TF 1.x
    tensorflow.python.estimator[.*]             tensorflow_estimator.python.estimator[.*] (TF 1.13-1.15
                                                forwarded these private paths to the package)
    tf.contrib.estimator                        replicate_model_fn and TowerOptimizer (`REPLICATED`:
                                                legacy/run_tf1/replicate.py), and the names TF 1.13 moved
                                                to tf.estimator unchanged (`MOVED_TO_CORE`)

`LazyModule` serves `tf.estimator` as an attribute (the package is imported at the first use, not
when the runner starts); `alias` names the module an import statement of one of these names loads;
`load` imports a module of the package.
"""
from __future__ import annotations

import importlib
import types
from typing import Any, Optional

V1_API = "tensorflow_estimator._api.v1.estimator"
# Import names of tf.estimator in a TF1 program (the upgrader writes `tensorflow.compat.v1.estimator`
# for `tensorflow.estimator`) -> the package module they are.
ALIASES = {
    "tensorflow.estimator": V1_API,
    "tensorflow.compat.v1.estimator": V1_API,
    "tensorflow._api.v2.compat.v1.estimator": V1_API,
    "tensorflow.python.estimator": "tensorflow_estimator.python.estimator",
}

# tf.contrib.estimator's names that TF 1.13 moved into tf.estimator unchanged (its release notes), by
# their home in the TF1 API.  contrib's heads and its canned estimators (`multi_class_head`,
# `DNNEstimator(head=...)`) took contrib's `_Head` objects, which tf.estimator's `Head` classes are not.
MOVED_TO_CORE = {
    V1_API: ("add_metrics",),
    f"{V1_API}.experimental": ("InMemoryEvaluatorHook", "make_early_stopping_hook", "stop_if_higher_hook",
                               "stop_if_lower_hook", "stop_if_no_decrease_hook", "stop_if_no_increase_hook",
                               "call_logit_fn", "dnn_logit_fn_builder", "linear_logit_fn_builder"),
}
REPLICATED = ("replicate_model_fn", "TowerOptimizer")
CONTRIB_HINT = ("contrib's heads and canned estimators took contrib's _Head objects; tf.estimator has its own: "
                "tf.estimator.MultiClassHead, tf.estimator.DNNEstimator(head=...)")


def load(name: str) -> types.ModuleType:
    """A module of tensorflow-estimator, imported after `legacy.estimator_compat` supplied what it needs."""
    from legacy import estimator_compat
    estimator_compat.install()
    return importlib.import_module(name)


def alias(fullname: str) -> Optional[str]:
    """The tensorflow-estimator module an import of `fullname` loads, or None where it names none."""
    for name, target in ALIASES.items():
        if fullname == name or fullname.startswith(name + "."):
            return target + fullname[len(name):]
    return None


class LazyModule(types.ModuleType):
    """`tf.estimator`: tensorflow-estimator's TF1 API, imported at its first attribute."""

    def __init__(self, name: str, target: str):
        super().__init__(name, f"{target}, imported at first use (legacy.run_tf1.estimator)")
        self._target = target

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_target":
            raise AttributeError(attr)
        return getattr(load(self._target), attr)

    def __dir__(self) -> list[str]:
        return dir(load(self._target))
