"""The one module that reaches into Keras 3 where it has no public API (pinned by
tests/test_modern_cifar.py::test_fused_adam_runs_tf1_kernel_arithmetic_and_keeps_keras_slots and by
`keras>=3.15,<3.16` in pyproject.toml; a Keras release that moves these fails that test first).

    adam_slots(optimizer, variable)       Adam's m and v for a variable (TF1: optimizer.get_slot(var, 'm'))
    optimizer_slots(optimizer, variable, variables)  any optimizer's slots for a variable, by name
    optimizer_order(optimizer), variable_index(optimizer, variable)  the optimizer's order of its variables
    resource_handle(variable)             the tf resource handle under a Keras variable, for raw TF ops
    all_layers(model[, recursive])         every layer inside a model, nested layers included (or not)
"""
from __future__ import annotations

from typing import Any, Sequence

import keras


def adam_slots(optimizer: Any, variable: Any) -> tuple[Any, Any]:
    """(m, v): the first- and second-moment slot variables Keras' Adam keeps for a model variable.

    Private in Keras 3: `optimizer._get_variable_index`, `_momentums`, `_velocities`.
    """
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def optimizer_slots(optimizer: Any, variable: Any, variables: Sequence[Any]) -> dict[str, Any]:
    """{slot name: variable} for one model variable of `variables`, for any Keras 3 optimizer (a user's
    own subclass included): every optimizer variable `add_variable_from_reference` made from it, by the
    name it was given (Adam: 'momentum', 'velocity'; SGD with momentum: 'momentum'; RMSprop:
    'velocity', 'momentum', 'average_gradient'; ...).

    Keras 3 names such a variable `{the model variable's path, '/' as '_'}_{name}`
    (BaseOptimizer.add_variable_from_reference); of the model variables whose path prefixes it, the
    longest is its own (`dense_1_kernel_m` belongs to `dense_1/kernel`, not to `dense/1_kernel`).
    """
    prefixes = [v.path.replace("/", "_") + "_" for v in variables]
    own = variable.path.replace("/", "_") + "_"
    slots = {}
    for slot in optimizer.variables:
        name = slot.name
        if name.startswith(own) and max((p for p in prefixes if name.startswith(p)), key=len, default=own) == own:
            slots[name[len(own):]] = slot
    return slots


def optimizer_order(optimizer: Any) -> list[Any]:
    """The model variables an optimizer updates, in its own order (the order of its slots and of
    `variable_index`).  Private in Keras 3: `_trainable_variables`."""
    return list(optimizer._trainable_variables)


def variable_index(optimizer: Any, variable: Any) -> int:
    """A model variable's place in `optimizer_order`.  Private in Keras 3: `_get_variable_index`."""
    return int(optimizer._get_variable_index(variable))


def resource_handle(variable: Any) -> Any:
    """The resource handle of a Keras variable's (or a tf.Variable's) current replica copy.

    Public: a Keras variable's `.value` is its tf.Variable (a MirroredVariable under a strategy).
    """
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


def all_layers(model: Any, recursive: bool = True) -> list[Any]:
    """Every layer of `model`, depth first, nested layers (a block's sublayers) included; with
    `recursive=False` its own sublayers only (a block of layers counts as one).

    Private in Keras 3: `Layer._flatten_layers` (`model.layers` lists the top level only).
    """
    return list(model._flatten_layers(include_self=False, recursive=recursive))
