"""Run a user's TF1 multi-GPU tower program, unmodified, on TensorFlow 2.21.

    python -m legacy.run_tf1 [--gpus N] [--virtual-gpus N] PROGRAM.py [PROGRAM ARGS...]   # run it
    python -m legacy.run_tf1 --report PROGRAM.py                      # what would be mapped, without running it
    legacy-run-tf1 PROGRAM.py --num_gpus 2                            # the same, installed

Runner options come before the program's path; everything after it is the program's own argv.
Before the program runs, the runner gives it

1. TF1 behaviour and `tf.compat.v1` under the names it uses.  TensorFlow's own upgrader
   (`tf_upgrade_v2 --mode SAFETY`: `ASTCodeUpgrader(tf_upgrade_v2_safety.TFAPIChangeSpec())`)
   rewrites `import tensorflow as tf` to `import tensorflow.compat.v1 as tf` in the program and in
   the Python files of its own that it imports (its folder's, the working directory's,
   PYTHONPATH's), in memory: a `sys.meta_path` finder reads each
   file, upgrades it, and compiles it under its real file name (tracebacks show the user's lines);
   nothing is written, the folder stays byte for byte as it was.  `tf.compat.v1.disable_v2_behavior()`
   runs first; `tf.nn.rnn_cell`, which TF 2.21 looks for in Keras 3, is tf-keras's TF1 cells.
2. `tf.contrib`: each contrib module with a maintained home gets that home (`CONTRIB_HOMES`, one
   line per module: tf-slim for `slim`, `layers`, `framework`, `losses`, `metrics`, `training`;
   `tf.compat.v1.data` for `data`; ...), as the attribute `tf.contrib` and as importable modules
   (`import tensorflow.contrib.slim as slim`).  A contrib name without a home raises an error whose
   one-line message names it and says what to do.
3. `tf.estimator`: the released tensorflow-estimator 2.15.0, through `legacy/estimator_compat.py`.
4. Towers on virtual CPU devices: a tower the program places on `/gpu:N` with fewer than N+1 GPUs
   present runs on `/cpu:N`, and every session the program opens gets
   `ConfigProto.device_count['CPU']` = 1 + the highest CPU index its graph uses (without it, soft
   placement would silently put every tower on one CPU).  One line says so.

`--report` lists, without running anything, the upgrader's import rewrites, every `tf.X.Y` name and
`tf.contrib` name the program and its local modules use, and whether each maps; exit status 1 when
some name cannot.  As a library, for a harness that runs programs in its own process::

    with tf1_environment("train.py", log=print) as env:
        status = env.run_program(["--num_gpus", "2"])
        print(env.cpu_devices, env.device_line)

Leaving the `with` block undoes all of it.  Guide: docs/running-your-own-tf1-program.md.

The package by concern, each module importing only those above it in this list:

    log          the prefix of the runner's lines, and where they go
    estimator    tf.estimator's TF1 import names: tensorflow-estimator 2.15.0 (legacy/estimator_compat.py)
    replicate    tf.contrib.estimator.replicate_model_fn and TowerOptimizer, as TF 1.5-1.12 documented them
    distribute   tf.contrib.distribute's TF 1.x signatures on the core strategies
    contrib      tf.contrib's maintained homes, and the one line for a name without one
    upgrade      TensorFlow's upgrader in memory; the finder and loaders of the program's folder
    devices      /gpu:N without that GPU -> /cpu:N; device_count in every session; a strategy's devices;
                 the GPU queries answered with virtual GPUs
    environment  TF1Environment: all of the above set for one program, and undone
    scan         --report: what a run would map and what it cannot, without running it
    cli          the command line
"""
from legacy.run_tf1.cli import main
from legacy.run_tf1.contrib import (CONTRIB_HOMES, CONTRIB_NO_HOME, ContribAttributeError, ContribImportError,
                                    ContribTree)
from legacy.run_tf1.devices import DeviceMap, span, with_cpu_devices
from legacy.run_tf1.environment import TF1Environment, run_program, tf1_environment
from legacy.run_tf1.log import PREFIX
from legacy.run_tf1.scan import Report, format_report, report
from legacy.run_tf1.upgrade import ProgramError, Rewrite, Upgrade, UpgradeError, upgrade_source

__all__ = ["CONTRIB_HOMES", "CONTRIB_NO_HOME", "ContribAttributeError", "ContribImportError", "ContribTree",
           "DeviceMap", "PREFIX", "ProgramError", "Report", "Rewrite", "TF1Environment", "Upgrade", "UpgradeError",
           "format_report", "main", "report", "run_program", "span", "tf1_environment", "upgrade_source",
           "with_cpu_devices"]
