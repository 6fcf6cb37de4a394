"""pytest plugin: mend the tf-slim 1.1.0 tests' own code for NumPy 2 and TF 2.21, nothing else.

Some of tf-slim's installed tests fail before they reach tf-slim: their own code uses NumPy
names NumPy 2 removed, or TensorFlow-private names only the tests read.  Left alone, they hide
the tf-slim code they were written to test (`slim.learning.train`, the evaluation loops,
`assign_from_checkpoint`, ...).  Loaded with `-p slim_test_fixes` (this folder on `sys.path`),
this plugin mends exactly those lines in memory, as tf-slim's test modules are imported:

- `SOURCE_FIXES`: textual replacements in named test modules, each asserted to match, so a
  changed tf-slim shows up as an error instead of a silently unfixed test;
- `TEST_ONLY_NAMES`: TensorFlow names only the tests use, restored for the test process;
- `nose.tools.nottest`, the one thing `evaluation_test.py` imports from the retired nose runner.

tf-slim's library code is never touched: what runs it is `legacy.slim_compat` alone (`-p
legacy.slim_compat`).  Nothing is written to disk; the installed files and their bytecode caches
stay as they are.
"""
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

PACKAGE = "tf_slim"

# module (dotted, under tf_slim) -> ((old, new, reason), ...)
SOURCE_FIXES = {
    "learning_test": (
        ("int(2 * self._labels[i] +", "int(2 * self._labels[i, 0] +",
         "int() of a 1-element array: deprecated in NumPy 1.25, an error in NumPy 2.4"),),
    "training.training_test": (
        ("int(2 * self._labels[i] +", "int(2 * self._labels[i, 0] +",
         "int() of a 1-element array: deprecated in NumPy 1.25, an error in NumPy 2.4"),),
    "training.evaluation_test": (
        ("int(2 * self._labels[i] +", "int(2 * self._labels[i, 0] +",
         "int() of a 1-element array: deprecated in NumPy 1.25, an error in NumPy 2.4"),),
    "evaluation_test": (
        ("DumpingDebugHook(dumping_root, log_usage=False)", "DumpingDebugHook(dumping_root)",
         "tfdbg's hooks lost their log_usage argument in TF 2.14"),),
    "layers.sparse_ops_test": (
        ("np.object)", "object)", "np.object: removed in NumPy 1.24"),),
    "losses.metric_learning_test": (
        ("astype(np.float)", "astype(float)", "np.float: removed in NumPy 1.24"),),
    "metrics.metric_ops_large_test": (
        ("np.product(", "np.prod(", "np.product: removed in NumPy 2.0"),),
    "layers.layers_test": (
        ("np.product(", "np.prod(", "np.product: removed in NumPy 2.0"),),
    "data.tfexample_decoder_test": (
        ("image.tostring()", "image.tobytes()", "ndarray.tostring: removed in NumPy 2.3"),),
}

# (module, name, module that has it now, attribute there, why)
TEST_ONLY_NAMES = (
    ("tensorflow.python.ops.variables", "VariableV1", "tensorflow.python.ops.variable_v1",
     "VariableV1", "moved in TF 2.13"),
    ("tensorflow.python.ops.variable_scope", "resource_variables_enabled",
     "tensorflow.python.ops.resource_variables_toggle", "resource_variables_enabled",
     "moved in TF 2.16"),
    ("tensorflow.python.ops.variable_scope", "enable_resource_variables",
     "tensorflow.python.ops.resource_variables_toggle", "enable_resource_variables",
     "moved in TF 2.16"),
    ("tensorflow.python.ops.variable_scope", "disable_resource_variables",
     "tensorflow.python.ops.resource_variables_toggle", "disable_resource_variables",
     "moved in TF 2.16"),
)


def mend(module, source):
    """Apply `SOURCE_FIXES[module]` to `source`; raise if one no longer matches."""
    for old, new, reason in SOURCE_FIXES.get(module, ()):
        if old not in source:
            raise ImportError(f"tf_slim.{module}: test fix no longer matches ({reason}): {old!r}")
        source = source.replace(old, new)
    return source


class MendingLoader(importlib.machinery.SourceFileLoader):
    """Compile a tf-slim test module from its mended source; never read or write bytecode."""

    def get_code(self, fullname):
        source = self.get_data(self.path).decode("utf-8")
        module = fullname[len(PACKAGE) + 1:]
        return compile(mend(module, source), self.path, "exec", dont_inherit=True)


class MendingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(PACKAGE + ".") or fullname[len(PACKAGE) + 1:] not in SOURCE_FIXES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        spec.loader = MendingLoader(fullname, spec.origin)
        return spec


def restore_test_only_names():
    for module_name, name, home, attribute, _why in TEST_ONLY_NAMES:
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            setattr(module, name, getattr(importlib.import_module(home), attribute))


def nottest(function):
    """nose's `nottest`: mark a function as not a test."""
    function.__test__ = False
    return function


def provide_nose_nottest():
    try:
        import nose.tools  # noqa: F401
    except ImportError:
        nose = types.ModuleType("nose")
        tools = types.ModuleType("nose.tools")
        tools.nottest = nottest
        nose.tools = tools
        sys.modules.setdefault("nose", nose)
        sys.modules.setdefault("nose.tools", tools)


def install():
    if not any(isinstance(finder, MendingFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MendingFinder())
    restore_test_only_names()
    provide_nose_nottest()


install()
