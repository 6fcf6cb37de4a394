"""The flags check (compare/checks/flags.py) in a process of its own, for the parity harness.

The check builds both programs again for every shared flag that changes what they build: on
ResNet-v2-50, seconds of one core's Python each, with nothing else to do meanwhile.  Where a build
takes that long, the harness starts

    python -m compare.flags_process IN.json OUT.json

before the pairing's first check, so that these builds run beside its other checks, and reads the
check's Result back from OUT.json in its place (compare.checks.flags.launch, collect).  IN.json names
the adapter module and the programs it was made of, the pairing, the tower count, the seed, the data
files, a scratch folder of its own, the start checkpoint and the step's tolerance.
"""
import dataclasses
import json
import os
import sys


def main(in_path: str, out_path: str) -> None:
    with open(in_path) as f:
        meta = json.load(f)
    from compare import common, limits
    limits.configure(float(meta["seconds"]), enforce=True)  # each build within the run's limit, as in the harness's
    common.setup_devices(int(meta["towers"]))  # before any TensorFlow op runs, as in the harness's process
    common.blas_on_one_thread()
    import warnings
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    warnings.filterwarnings("ignore", message="`layer.apply` is deprecated", category=UserWarning)
    from compare import harness, report
    from compare.checks import flags

    pair = harness.reload_pair(meta["adapter"], meta["programs"])
    pairing = dataclasses.replace(next(p for p in pair.pairings if p.label == meta["pairing"]),
                                  same_rows_on_every_tower=meta["same_rows"])
    with common.data_autotune_off():
        sides = flags.apart_sides(pair, pairing, int(meta["towers"]), meta["files"], meta["tmp_dir"],
                                  int(meta["seed"]), meta["start"])
        try:
            result = flags.check_flags(sides, baseline_built=True, tolerance=float(meta["tolerance"]))
        finally:
            sides.close()
    report.write_json(out_path, [result], {"adapter": meta["adapter"], "pairing": meta["pairing"]})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the result is written: no teardown of the graphs and models (seconds on ResNet-v2-50)
