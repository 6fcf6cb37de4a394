"""The one module that reaches into Keras 3 where it has no public API (pinned by
tests/test_modern_cifar.py::test_fused_adam_runs_tf1_kernel_arithmetic_and_keeps_keras_slots and by
`keras>=3.15,<3.16` in pyproject.toml; a Keras release that moves these fails that test first).

    adam_slots(optimizer, variable)       Adam's m and v for a variable (TF1: optimizer.get_slot(var, 'm'))
    optimizer_slots(optimizer, variable)  the slots of Adam or SGD with momentum, by name
    resource_handle(variable)             the tf resource handle under a Keras variable, for raw TF ops
    all_layers(model)                     every layer inside a model, nested layers included
"""
from __future__ import annotations

from typing import Any

import keras


def adam_slots(optimizer: Any, variable: Any) -> tuple[Any, Any]:
    """(m, v): the first- and second-moment slot variables Keras' Adam keeps for a model variable.

    Private in Keras 3: `optimizer._get_variable_index`, `_momentums`, `_velocities`.
    """
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def optimizer_slots(optimizer: Any, variable: Any) -> dict[str, Any]:
    """{slot name: variable} for one model variable: {'m', 'v'} for Adam, {'momentum'} for SGD with
    momentum, {} for plain SGD.  Other optimizers: TypeError naming them.

    Private in Keras 3: `_get_variable_index`, `_momentums`, `_velocities` (SGD's `momentums` is public).
    """
    if isinstance(optimizer, keras.optimizers.Adam):
        m, v = adam_slots(optimizer, variable)
        return {"m": m, "v": v}
    if isinstance(optimizer, keras.optimizers.SGD):
        if not optimizer.momentum:
            return {}
        return {"momentum": optimizer.momentums[optimizer._get_variable_index(variable)]}
    raise TypeError(f"the harness knows the slots of Adam and SGD only, not of {type(optimizer).__name__}")


def resource_handle(variable: Any) -> Any:
    """The resource handle of a Keras variable's (or a tf.Variable's) current replica copy.

    Public: a Keras variable's `.value` is its tf.Variable (a MirroredVariable under a strategy).
    """
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def all_layers(model: Any) -> list[Any]:
    """Every layer of `model`, depth first, nested layers (a block's sublayers) included.

    Private in Keras 3: `Layer._flatten_layers` (`model.layers` lists the top level only).
    """
    return list(model._flatten_layers(include_self=False, recursive=True))
