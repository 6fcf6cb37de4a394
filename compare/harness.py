"""Judge one program pair: build each of its pairings, derive its tolerances, run the check groups.

    results = harness.judge_pair(pair, Settings(towers=2), tmp_dir, log=print)

Every pairing of the pair is built before any check runs, so an adapter that does not fit the
interface (a missing method, a tensor of the wrong shape, a variable mapped to none or to two) is
refused with one line naming it (AdapterError, HarnessError) before a single check.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

from compare import sides as sides_module
from compare import tolerances
from compare.checks import averages, basics, evaluation, flags, forward, free, shuffle, splits, steps, trained
from compare.interface import GROUPS, AdapterError, Pair, validate
from compare.report import STATIC, not_applicable
from compare.sides import HarnessError



@dataclasses.dataclass
class Settings:
    """What the harness runs: the tower count, the steps, the start, which groups."""
    towers: int = 2
    steps: Optional[int] = None        # restart-per-step training steps (default 6, --quick 2)
    free_steps: Optional[int] = None   # free-running and moving-average steps (default: the pair's)
    seed: int = 0
    quick: bool = False
    checkpoint: Optional[str] = None   # start from this TF1 checkpoint of the legacy program
    only: tuple = GROUPS
    tf1_repeats: int = 1               # the TF1-runtime step run this many times from the same state

    def restart_steps(self):
        return self.steps or (2 if self.quick else 6)

    def free_steps_for(self, pair: Pair):
        if self.free_steps is not None:
            return self.free_steps
        return pair.quick_free_steps if self.quick else pair.free_steps


def load_adapter(module_name: str) -> Pair:
    """The PAIR of an adapter module, importable from the current folder or installed."""
    import importlib
    import sys
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise AdapterError(f"--pair {module_name}: cannot import it ({e}); it must be importable from the "
                           f"current folder or installed") from None
    if not hasattr(module, "PAIR"):
        raise AdapterError(f"--pair {module_name}: the module defines no PAIR (see compare/interface.py)")
    pair = validate(module.PAIR, module_name)
    pair.module = module_name
    return pair


def build_pairings(pair: Pair, settings: Settings, files, tmp_dir, log):
    """Every pairing the settings run, built (both sides), with its derived tolerances."""
    built, modern_by_argv, start_path = [], {}, None
    for pairing in pair.pairings:
        if settings.quick and not pairing.quick:
            continue
        groups = [g for g in (pairing.groups or GROUPS) if g in settings.only]
        if not groups:
            continue
        with basics.shuffle_off():
            sides = sides_module.build(pair, pairing, settings.towers, files, tmp_dir, settings.seed,
                                       checkpoint=settings.checkpoint, start_path=start_path, log=log,
                                       modern=modern_by_argv.get(pairing.modern_argv))
        modern_by_argv[pairing.modern_argv] = sides.modern
        start_path = sides.start_path
        derived = tolerances.derive(sides, settings.free_steps_for(pair) or 1)
        sides.tolerances = dict(STATIC, model=derived["model"], steps=derived["steps"])
        sides.spread = derived["spread"]
        built.append((sides, groups))
    return built


def write_files(pair: Pair, settings: Settings, tmp_dir: str) -> dict:
    """The pair's data files for this run, and an empty scratch folder for the programs' outputs."""
    files = dict(pair.data.write(os.path.join(tmp_dir, f"{pair.name}_data"), settings.towers, settings.seed))
    files["scratch"] = os.path.join(tmp_dir, f"{pair.name}_scratch")
    os.makedirs(files["scratch"], exist_ok=True)
    return files


def judge_pair(pair: Pair, settings: Settings, tmp_dir: str, log: Callable = print):
    """All checks of `pair` under `settings`; returns the Results."""
    validate(pair)
    files = write_files(pair, settings, tmp_dir)
    built = build_pairings(pair, settings, files, tmp_dir, log)
    results = []
    try:
        for index, (sides, groups) in enumerate(built):
            t = sides.tolerances["model"]
            log(f"{pair.name}: {sides.label}model tolerance {t.rel_l2:.2g} = {t.derivation}")
            results += run_groups(sides, groups, settings, log)
            if index == 0 and pair.extra_checks is not None:
                results += pair.extra_checks(sides, settings, log)
    finally:
        for sides, _ in built:
            sides.close()
    return results


def run_groups(sides, groups, settings, log):
    pair, name = sides.pair, sides.pair.name
    free_steps = settings.free_steps_for(pair)
    out = []
    if "basics" in groups:
        log(f"{name}: {sides.label}configuration, variables, checkpoint, pipelines")
        out += [basics.check_config(sides), basics.check_variables(sides),
                basics.check_checkpoint_round_trip(sides), basics.check_pipelines(sides)]
    if "shuffle" in groups:
        log(f"{name}: {sides.label}both training pipelines, shuffled, over two epochs")
        out.append(shuffle.check_shuffle(sides))
    if "flags" in groups and not settings.quick:
        log(f"{name}: {sides.label}every shared flag at another value, through what each program builds")
        out.append(flags.check_flags(sides))
    if "forward" in groups:
        log(f"{name}: {sides.label}inference, dropout")
        out += [forward.check_inference(sides), forward.check_dropout(sides)]
    if "training" in groups:
        log(f"{name}: {sides.label}training forward pass and gradients")
        out += forward.check_training(sides)
        out.append(forward.check_free_variables(sides))
    if "splits" in groups:
        log(f"{name}: {sides.label}batch splits")
        out += splits.check_splits(sides)
    if "steps" in groups:
        count = settings.restart_steps()
        log(f"{name}: {sides.label}{count} training steps from the legacy state across its schedule")
        out += steps.check_training_steps(sides, count)
    if "averages" in groups:
        if free_steps:
            log(f"{name}: {sides.label}moving averages over {free_steps} steps")
            out += averages.check_moving_averages(sides, free_steps)
    if "free" in groups:
        if free_steps:
            log(f"{name}: {sides.label}{free_steps} free-running steps, and the legacy program again from weights "
                f"1 ulp away")
            out.append(free.check_free_running(sides, free_steps))
    if "trained" in groups:
        log(f"{name}: {sides.label}the training checks again from a trained, perturbed state past the schedule")
        out += trained.check_trained(sides, settings, free_steps)
    if "evaluation" in groups:
        out.append(evaluation.check_evaluation(sides))
    if "tf1" in groups and not settings.quick:
        if "tf1_runtime" in pair.capabilities:
            from compare.checks import tf1
            log(f"{name}: {sides.label}the legacy graph on TF1's runtime, in its own process")
            out += tf1.check_tf1_runtime(sides, settings)
        else:
            out.append(not_applicable(f"{sides.label}legacy on TF1's runtime", name,
                                      "the adapter does not declare capability 'tf1_runtime'"))
    return out


__all__ = ["GROUPS", "Settings", "judge_pair", "load_adapter", "AdapterError", "HarnessError"]
