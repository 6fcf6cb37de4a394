"""The modules this repository's two pair adapters (compare/pairs/) drive, one per role, as one typed object.

The adapters never copy or stand in for a program's code: they import the program's module and
call its functions, as the program's own `main` does.  A role is the list of names a module must
define; each is documented below by what the adapter does with it.  Any module that defines them
can take a role: `python compare/run.py --program modern_cifar=my_package.my_trainer` judges every
check against `my_package/my_trainer.py` instead of `modern/cifar_resnet.py`.  (A program written
another way is judged through an adapter of its own: compare/interface.py.)

    programs = Programs.load(modern_cifar="my_package.my_trainer")   # the defaults, one role replaced
    pair = compare.pairs.cifar_resnet.make_pair(programs)

The adapters read a program's functions off the module at call time
(`self.programs.modern_cifar.make_train_step(...)`), so a test that patches a function of the real
module (monkeypatch) patches what is judged.
"""
from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Union


@dataclasses.dataclass(frozen=True)
class Role:
    """A role: the module that fills it by default, and the names a module must define to fill it
    (functions; UPPER_CASE names are data), each with what the adapter does with it."""
    default: str
    needs: dict[str, str]


ROLES: dict[str, Role] = {
    "legacy_cifar": Role("legacy.cifar_resnet", {
        "parse_args": "argv -> the program's parsed flags (its defaults are compared with the modern ones)",
        "make_datasets": "the input pipelines (train, valid) of the TF1 graph, compared batch for batch",
        "build_graph": "the training graph with its towers, as the trainer builds it",
        "make_feed": "the placeholders' feed for one batch (rows, keep_prob, is_training)",
        "tower_split": "how a batch of B rows is cut over the towers (rows per tower, dropped rows)",
        "describe_split": "the program's own log line about a batch the split does not hand out evenly",
        "session_config": "the trainer's ConfigProto (virtual CPU devices, grappler)",
        "validate": "the trainer's validation pass over a dataset",
        "EMBEDDED_PROFILE": "the flag values of the embedded-data profile (compared with the modern ones)",
        "ORIGINAL_PROFILE": "the original's flag values",
    }),
    "modern_cifar": Role("modern.cifar_resnet", {
        "parse_args": "argv -> parsed flags",
        "make_datasets": "the tf.data pipelines of global batches (train, valid)",
        "spread_short_batch": "a global batch -> (x, y, weights) that never leaves a replica empty",
        "build": "model, optimizer and checkpoint in the strategy's scope",
        "make_train_step": "the tf.function the trainer runs for one step (gradients read out of it)",
        "make_eval_step": "the tf.function of one validation batch",
        "validate": "the trainer's validation pass",
        "EMBEDDED_PROFILE": "as legacy_cifar's",
        "ORIGINAL_PROFILE": "as legacy_cifar's",
    }),
    "legacy_mnist": Role("legacy.mnist_multi_gpu", {
        "parse_args": "argv -> parsed flags",
        "get_input": "the queue-free input of the TF1 trainer (one batch, or one per tower)",
        "build_train_graph": "the training graph: towers, averaged gradients, SGD, moving averages",
    }),
    "legacy_mnist_eval": Role("legacy.mnist_eval", {
        "parse_args": "argv -> parsed flags (its moving-average decay must be the trainer's)",
        "evaluate_checkpoint": "the accuracy of a checkpoint through its moving averages",
    }),
    "modern_mnist": Role("modern.mnist_multi_gpu", {
        "parse_args": "argv -> parsed flags",
        "get_input": "the dataset of global batches",
        "same_batch_on_every_replica": "one batch tiled for every replica (--same_batch_per_replica)",
        "build_model": "the Keras model (its l2 regularisers included)",
        "make_optimizer": "SGD on the decaying learning rate",
        "make_moving_average": "the moving averages of the weights",
        "make_train_step": "the tf.function the trainer runs for one step",
        "legacy_name": "a variable -> its TF1 name (checkpoints and reports use TF1 names)",
        "evaluate_averaged": "the accuracy of the moving averages on a TFRecord file",
    }),
}


class InterfaceError(Exception):
    """A module does not implement the role it is given."""


def missing(module: ModuleType, role: str) -> list[str]:
    """The names of the role that `module` does not define (as callables; UPPER_CASE names as data), in order."""
    return [name for name in ROLES[role].needs
            if not (hasattr(module, name) if name.isupper() else callable(getattr(module, name, None)))]


def module_for(role: str, module: Union[str, ModuleType]) -> ModuleType:
    """`module` (a module or a dotted name) checked against `role`; InterfaceError naming what is missing."""
    if role not in ROLES:
        raise InterfaceError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
    if isinstance(module, str):
        try:
            module = importlib.import_module(module)
        except ImportError as e:
            raise InterfaceError(f"--program {role}={module}: cannot import it ({e})") from None
    lacks = missing(module, role)
    if lacks:
        raise InterfaceError(f"{module.__name__} cannot be judged as {role}: it does not define "
                             f"{', '.join(lacks)} (see compare/programs.py)")
    return module


@dataclasses.dataclass(frozen=True)
class Programs:
    """The module in each role."""
    legacy_cifar: ModuleType
    modern_cifar: ModuleType
    legacy_mnist: ModuleType
    legacy_mnist_eval: ModuleType
    modern_mnist: ModuleType

    @classmethod
    def load(cls, **roles: Union[str, ModuleType]) -> Programs:
        """The default module of every role, those given (role=module or dotted name) instead; each
        checked against its role first (InterfaceError, naming what is missing)."""
        given = {role: module_for(role, module) for role, module in roles.items()}
        return cls(**{role: given.get(role) or module_for(role, spec.default) for role, spec in ROLES.items()})

    def replace(self, **roles: Union[str, ModuleType]) -> Programs:
        """These programs with some roles given other modules (checked as by `load`)."""
        return dataclasses.replace(self, **{role: module_for(role, module) for role, module in roles.items()})
