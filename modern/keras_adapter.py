"""The one module that reaches into Keras 3 where it has no public API (pinned by
tests/test_modern_cifar.py::test_fused_adam_runs_tf1_kernel_arithmetic_and_keeps_keras_slots and by
`keras==3.15.*` in pyproject.toml; a Keras release that moves these fails that test first).

    adam_slots(optimizer, variable)   Adam's m and v for a variable (TF1: optimizer.get_slot(var, 'm'))
    resource_handle(variable)         the tf resource handle under a Keras variable, for raw TF ops
"""
import keras


def adam_slots(optimizer, variable):
    """(m, v): the first- and second-moment slot variables Keras' Adam keeps for a model variable.

    Private in Keras 3: `optimizer._get_variable_index`, `_momentums`, `_velocities`.
    """
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def resource_handle(variable):
    """The resource handle of a Keras variable's (or a tf.Variable's) current replica copy.

    Public: a Keras variable's `.value` is its tf.Variable (a MirroredVariable under a strategy).
    """
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
