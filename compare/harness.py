"""Judge one program pair: build each of its pairings, derive its tolerances, run the check groups.

    results = harness.judge_pair(pair, Settings(towers=2), tmp_dir, log=print)

Every pairing of the pair is built before any check runs, so an adapter that does not fit the
interface (a missing method, a tensor of the wrong shape, a variable mapped to none or to two) is
refused with one line naming it (AdapterError, HarnessError) before a single check.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Mapping, Optional

from compare import common
from compare import sides as sides_module
from compare import tolerances
from compare.checks import basics, registry
from compare.checks.registry import Context, origin, run_check
from compare.interface import GROUPS, AdapterError, DataFiles, Pair, validate
from compare.limits import OutOfTime
from compare.programs import Programs
from compare.report import Result
from compare.settings import Settings
from compare.sides import HarnessError, Sides

Log = Callable[[str], None]


def load_adapter(module_name: str, programs: Optional[Programs] = None) -> Pair:
    """The PAIR of an adapter module, importable from the current folder or installed; with
    `programs`, the pair a seed adapter's `make_pair` makes of them instead."""
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
    made_of = programs is not None and hasattr(module, "make_pair")
    pair = validate(module.make_pair(programs) if made_of else module.PAIR, module_name)
    pair.module = module_name
    if made_of and programs is not None:
        pair.programs = {f.name: getattr(programs, f.name).__name__ for f in dataclasses.fields(programs)}
    return pair


def reload_pair(module_name: str, programs: Mapping[str, str]) -> Pair:
    """The pair `load_adapter` loaded, loaded again in another process: from its adapter module and
    the programs it was made of (`Pair.module`, `Pair.programs`)."""
    return load_adapter(module_name, Programs.load(**programs) if programs else None)


def build_pairings(pair: Pair, settings: Settings, files: DataFiles, tmp_dir: str,
                   log: Log) -> list[tuple[Sides, list[str]]]:
    """Every pairing the settings run, built (both sides), with its derived tolerances."""
    built: list[tuple[Sides, list[str]]] = []

    def derive(sides: Sides) -> None:  # on the legacy side alone, beside the modern build
        sides.tolerances = tolerances.derive(sides, settings.free_steps_for(pair) or 1)
    modern_by_argv: dict[tuple[str, ...], sides_module.ModernRun] = {}
    start_path = None
    todo = [(pairing, [g for g in (pairing.groups or GROUPS) if g in settings.only]) for pairing in pair.pairings
            if pairing.quick or not settings.quick]
    todo = [(pairing, groups) for pairing, groups in todo if groups]  # the pairings to build, in order
    for index, (pairing, groups) in enumerate(todo):
        try:
            with basics.shuffle_off():
                sides = sides_module.build(pair, pairing, settings.towers, files, tmp_dir, settings.seed,
                                           checkpoint=settings.checkpoint, start_path=start_path, log=log,
                                           modern=modern_by_argv.get(pairing.modern_argv), ready=derive,
                                           trace=index == len(todo) - 1)
        except (AdapterError, HarnessError, OutOfTime):
            close(built)
            raise
        except Exception as error:  # an adapter or program that fails to build: one line, nothing judged
            close(built)
            raise HarnessError(f"building {pair.name}{' ' + pairing.label if pairing.label else ''} failed: "
                               f"{type(error).__name__}: {first_line(error)} (raised in {origin(error)})") from error
        modern_by_argv[pairing.modern_argv] = sides.modern
        start_path = sides.start_path
        built.append((sides, groups))
    for modern in modern_by_argv.values():  # the ports of the earlier pairings, where not the last's
        modern.trace()
    return built


def close(built: list[tuple[Sides, list[str]]]) -> None:
    for sides, _ in built:
        sides.close()


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def write_files(pair: Pair, settings: Settings, tmp_dir: str) -> dict[str, str]:
    """The pair's data files for this run, and an empty scratch folder for the programs' outputs."""
    files = dict(pair.data.write(os.path.join(tmp_dir, f"{pair.name}_data"), settings.towers, settings.seed))
    files["scratch"] = os.path.join(tmp_dir, f"{pair.name}_scratch")
    os.makedirs(files["scratch"], exist_ok=True)
    return files


def judge_pair(pair: Pair, settings: Settings, tmp_dir: str, log: Log = print) -> list[Result]:
    """All checks of `pair` under `settings`; returns the Results."""
    validate(pair)
    with common.data_autotune_off():
        files = write_files(pair, settings, tmp_dir)
        built = build_pairings(pair, settings, files, tmp_dir, log)
        return run_pairings(pair, built, settings, log)


def run_pairings(pair: Pair, built: list[tuple[Sides, list[str]]], settings: Settings, log: Log) -> list[Result]:
    """The checks of every built pairing, closing each at the end."""
    results: list[Result] = []
    try:
        for index, (sides, groups) in enumerate(built):
            t = sides.tol.model
            log(f"{pair.name}: {sides.label}model tolerance {t.rel_l2:.2g} = {t.derivation}")
            results += tolerances.power(sides)
            results += run_groups(sides, groups, settings, log)
            if index == 0 and pair.extra_checks is not None:
                results += run_check(f"{pair.name}'s own checks",
                                     functools.partial(pair.extra_checks, sides, settings, log), "", pair.name)
    finally:
        for sides, _ in built:
            sides.close()
    return results


def run_groups(sides: Sides, groups: list[str], settings: Settings, log: Log) -> list[Result]:
    """The checks of `groups` on one built pairing (compare.checks.registry)."""
    return registry.run_groups(Context(sides, settings, log), groups)


__all__ = ["GROUPS", "Settings", "judge_pair", "load_adapter", "AdapterError", "HarnessError"]
