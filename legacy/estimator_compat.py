"""`tf.estimator` on TensorFlow 2.21: the real tensorflow-estimator 2.15.0, with what TF 2.21 removed supplied.

TensorFlow 2.16 dropped `tf.estimator`; its package, tensorflow-estimator, stopped at 2.15.0 and does not
import on TF 2.21.  This module supplies exactly the TensorFlow pieces that package reaches on its local
paths (one machine, its devices, with or without a `tf.distribute` strategy) and that TF 2.21 removed,
then imports the package as released::

    from legacy import estimator_compat
    tf_estimator = estimator_compat.v1()         # what tf.compat.v1.estimator was under TF 1.15
    tf_estimator.Estimator(model_fn, model_dir, config=tf_estimator.RunConfig(train_distribute=strategy))

Nothing of tensorflow-estimator is copied or edited: the Estimator, its hooks, `RunConfig`, the
`MonitoredTrainingSession` it trains in and the strategies are the released code.  The pieces:

1. `tf_export`'s `estimator` API name.  The package's `estimator_export` decorator records each
   symbol's public names under that API (`_estimator_api_names`, `_estimator_api_names_v1`, and the
   constants' lists); TF 2.21's `tf_export` knows only the `tensorflow` and `keras` APIs and raises
   `AttributeError` at the first decorated class.  The name and its two attribute pairs are put
   back as TF 2.15 had them: the decorator only writes those attributes and a name -> symbol map,
   which nothing at run time reads.

2. `tensorflow.python.distribute.estimator_training`, TF's bridge from Estimator to the distribute
   coordinator, removed with it.  `RunConfig(train_distribute=...)` calls its `init_run_config`, and
   `Estimator.train` / `evaluate` / `train_and_evaluate` ask it whether to run the coordinator.  On
   one machine (no `TF_CONFIG` cluster, or one with a `master` job) the bridge set
   `_distribute_coordinator_mode = None` and then configured the `RunConfig` from the environment,
   as `RunConfig` does without a strategy; Estimator then trains with the strategy in its own graph.
   That path is served here, step for step.  The coordinator's own modes (a `TF_CONFIG` cluster of
   workers, `experimental_distribute.remote_cluster`) are not: they raise `EstimatorUnavailable`,
   one line.

3. The TPU modules TensorFlow 2.21 removed (`tpu_embedding`, `tpu_embedding_gradient`,
   `session_support`), which `TPUEstimator` imports at the top of its files and reaches only on a
   TPU.  Each is a module of stand-ins: the package imports, and any use of one raises
   `EstimatorUnavailable` naming it.

Every piece is idempotent and supplies nothing where TensorFlow still has it.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any, NoReturn

ESTIMATOR_API_NAME = "estimator"
BRIDGE = "tensorflow.python.distribute.estimator_training"
# The TPU modules tensorflow-estimator imports (tpu/_tpu_estimator_embedding.py, tpu/tpu_estimator.py)
# that TensorFlow removed, with the release that removed them.
TPU_MODULES = {
    "tensorflow.python.tpu.tpu_embedding": "2.16",
    "tensorflow.python.tpu.tpu_embedding_gradient": "2.16",
    "tensorflow.python.tpu.session_support": "2.16",
}


class EstimatorUnavailable(RuntimeError):
    """A path of tensorflow-estimator that needs a part of TensorFlow 2.21 no longer has (one-line message)."""


def unavailable(what: str) -> NoReturn:
    raise EstimatorUnavailable(what)


# ---------------------------------------------------------------------------------------------
# 1. tf_export's estimator API

def register_estimator_api() -> bool:
    """Give `tf_export` the `estimator` API name and its attribute names, as TF 2.15 had them.
    Returns whether anything was added."""
    from tensorflow.python.util import tf_export
    if getattr(tf_export, "ESTIMATOR_API_NAME", None) == ESTIMATOR_API_NAME \
            and ESTIMATOR_API_NAME in tf_export.API_ATTRS:
        return False
    attributes = tf_export._Attributes  # the (names, constants) record of each API
    tf_export.ESTIMATOR_API_NAME = ESTIMATOR_API_NAME
    tf_export.API_ATTRS[ESTIMATOR_API_NAME] = attributes("_estimator_api_names", "_estimator_api_constants")
    tf_export.API_ATTRS_V1[ESTIMATOR_API_NAME] = attributes("_estimator_api_names_v1",
                                                             "_estimator_api_constants_v1")
    return True


# ---------------------------------------------------------------------------------------------
# 2. The bridge to the distribute coordinator, on its local path

COORDINATOR = ("the distribute coordinator's {mode} mode (Estimator across machines through a TF_CONFIG "
               "cluster or a remote cluster) is gone from TensorFlow 2.21 and is not served here: train on one "
               "machine (no TF_CONFIG cluster), or port the multi-worker part to tf.distribute with Keras")


def init_run_config(config: Any, tf_config: dict) -> None:
    """`RunConfig.__init__` with a strategy: the train and eval strategies taken from
    `experimental_distribute` where given there, then, on one machine, the distributed settings from the
    environment, as `RunConfig` sets them without a strategy, and no coordinator."""
    experimental = config._experimental_distribute
    for field in ("train_distribute", "eval_distribute"):
        given = getattr(experimental, field, None) if experimental else None
        if given:
            if getattr(config, f"_{field}"):
                raise ValueError(f"Either `{field}` or `experimental_distribute.{field}` can be set.")
            setattr(config, f"_{field}", given)
    if config._train_distribute and experimental and getattr(experimental, "remote_cluster", None):
        unavailable(COORDINATOR.format(mode="STANDALONE_CLIENT"))
    cluster = (tf_config or {}).get("cluster", {})
    if tf_config and "master" not in cluster and config._train_distribute:
        unavailable(COORDINATOR.format(mode="INDEPENDENT_WORKER"))
    config._distribute_coordinator_mode = None
    config._init_distributed_setting_from_environment_var(tf_config)
    config._maybe_overwrite_session_config_for_distributed_training()


def should_run_distribute_coordinator(config: Any) -> bool:
    """False: `init_run_config` sets no coordinator mode, and one set by hand names a mode not served."""
    mode = getattr(config, "_distribute_coordinator_mode", None)
    if mode:
        unavailable(COORDINATOR.format(mode=mode))
    return False


def coordinator_entry(name: str) -> Any:
    def entry(*_: Any, **__: Any) -> NoReturn:
        unavailable(COORDINATOR.format(mode="coordinator") + f" ({name})")
    entry.__name__ = name
    return entry


def install_bridge() -> bool:
    """Register `estimator_training` where TensorFlow lacks it.  Returns whether it was added."""
    try:
        importlib.import_module(BRIDGE)
        return False
    except ModuleNotFoundError:
        pass
    module = types.ModuleType(BRIDGE, "Estimator's bridge to the distribute coordinator, on its local path "
                                      "(legacy.estimator_compat).")
    module.__dict__.update(
        init_run_config=init_run_config, should_run_distribute_coordinator=should_run_distribute_coordinator,
        train_and_evaluate=coordinator_entry("train_and_evaluate"),
        estimator_train=coordinator_entry("estimator_train"),
        estimator_evaluate=coordinator_entry("estimator_evaluate"))
    sys.modules[BRIDGE] = module
    import tensorflow.python.distribute as distribute
    distribute.estimator_training = module  # as `from ... import` finds it
    return True


# ---------------------------------------------------------------------------------------------
# 3. The TPU modules, as stand-ins

class StandInModule(types.ModuleType):
    """A removed TensorFlow module: each attribute is a stand-in class that raises on use."""

    def __init__(self, name: str, release: str):
        super().__init__(name, f"Stand-ins for {name}, removed in TensorFlow {release} (legacy.estimator_compat).")
        self._release = release

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        message = (f"{self.__name__}.{attr} is gone since TensorFlow {self._release}: TPUEstimator's TPU paths "
                   f"(TPU embedding, its worker watchdog) cannot run on TF 2.21")

        def refuse(*_: Any, **__: Any) -> NoReturn:
            unavailable(message)
        stand_in = type(attr, (), {"__new__": refuse, "__doc__": message, "__module__": self.__name__})
        setattr(self, attr, stand_in)
        return stand_in


def install_tpu_stand_ins() -> list[str]:
    """Register a stand-in for each of `TPU_MODULES` that TensorFlow lacks.  Returns their names."""
    added = []
    for name, release in TPU_MODULES.items():
        try:
            importlib.import_module(name)
            continue
        except ModuleNotFoundError:
            pass
        module = StandInModule(name, release)
        sys.modules[name] = module
        parent, _, attr = name.rpartition(".")
        setattr(importlib.import_module(parent), attr, module)
        added.append(name)
    return added


# ---------------------------------------------------------------------------------------------

def install() -> None:
    """Supply all three pieces (idempotent)."""
    register_estimator_api()
    install_bridge()
    install_tpu_stand_ins()


def v1() -> types.ModuleType:
    """tensorflow-estimator's TF1 API (`tf.compat.v1.estimator`, what `tf.estimator` was in TF 1.x)."""
    install()
    return importlib.import_module("tensorflow_estimator._api.v1.estimator")


def v2() -> types.ModuleType:
    """tensorflow-estimator's TF2 API (`tf.estimator` of TF 2.0-2.15)."""
    install()
    return importlib.import_module("tensorflow_estimator._api.v2.estimator")
