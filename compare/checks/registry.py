"""The checks the harness runs, by group, in one table: one typed signature, `(Context) -> list[Result]`.

    REGISTRY            group name -> Group (its progress line, when it runs, its checks in order, and
                        any work it begins before the pairing's first check: the TF1-runtime process,
                        the flags check's own process)
    run_groups(ctx, gs) every check of the groups; a check that raises is that check's ERROR result (the
                        exception and the adapter or program frame it came from), and the group's other
                        checks still run; a batch the legacy program can never receive (NotFed) makes
                        the check NOT APPLICABLE with the adapter's reason

A new check is one `Check` in its group's list (and a function in the module of what it judges);
a new group is one `Group` here and its name in `compare.interface.GROUPS`.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
import traceback
from typing import Any, Callable, Optional

from compare.checks import (averages, basics, evaluation, flags, forward, free, shuffle, splits, steps, structure, tf1,
                            trained)
from compare.interface import GROUPS, NotFed, undeclared
from compare.limits import OutOfTime
from compare.report import Result, error_result, not_applicable
from compare.settings import Settings
from compare.sides import Sides


@dataclasses.dataclass(frozen=True)
class Context:
    """What every check is given: the built pairing, the run's settings, the progress log."""
    sides: Sides
    settings: Settings
    log: Callable[[str], None]
    started: dict[str, Any] = dataclasses.field(default_factory=dict)  # group -> what its `start` began

    @property
    def free_steps(self) -> int:
        return self.settings.free_steps_for(self.sides.pair)


CheckFn = Callable[[Context], list[Result]]


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: its name (the report's, for an ERROR line) and the function that runs it."""
    name: str
    run: CheckFn


@dataclasses.dataclass(frozen=True)
class Group:
    """A group of checks: the progress line it logs (none when empty), whether it runs under the
    settings, its checks in order."""
    name: str
    title: Callable[[Context], str]
    runs: Callable[[Context], bool]
    checks: tuple[Check, ...]
    # Work begun before the pairing's first group, to go on beside the others (a process of its own):
    # what it returns (or raises) is ctx.started[name] for the group's checks.
    start: Optional[Callable[[Context], Any]] = None


def always(ctx: Context) -> bool:
    return True


def not_quick(ctx: Context) -> bool:
    return not ctx.settings.quick


def free_steps(ctx: Context) -> bool:
    return ctx.free_steps > 0


def tf1_launch(ctx: Context) -> Optional[tf1.Launched]:
    """The TF1-runtime process, started where the adapter declares a build on TF1's runtime."""
    return tf1.launch(ctx.sides, ctx.settings) if "tf1_runtime" in ctx.sides.pair.capabilities else None


def flags_launch(ctx: Context) -> Optional[flags.Apart]:
    """The flags check's own process, where its builds are slow (compare.checks.flags.launch)."""
    return flags.launch(ctx.sides)


def flags_title(ctx: Context) -> str:
    apart = isinstance(ctx.started.get("flags"), flags.Apart)
    return ("every shared flag at another value, through what each program builds"
            + (" (in its own process, started before the first check)" if apart else ""))


def tf1_runtime(ctx: Context) -> list[Result]:
    """The legacy graph on TF1's runtime, where the adapter declares it can be built there."""
    if "tf1_runtime" not in ctx.sides.pair.capabilities:
        return [not_applicable(f"{ctx.sides.label}legacy on TF1's runtime", ctx.sides.pair.name,
                               undeclared(ctx.sides.pair, "a build on TF1's runtime", "tf1_runtime"))]
    ctx.log(f"{ctx.sides.pair.name}: {ctx.sides.label}the legacy graph on TF1's runtime, in its own process "
            f"(started before the first check)")
    launched = ctx.started["tf1"]
    if isinstance(launched, BaseException):
        raise launched
    return tf1.check_tf1_runtime(ctx.sides, launched)


def split_case(case: str, run: Callable[[Sides], list[Result]], applies: Callable[[Sides], bool]) -> Check:
    """A split case: NOT run where nothing is split (one tower, or every tower sees every row)."""
    return Check(f"split: {case}", lambda ctx: splits.fed(ctx.sides, case, lambda: run(ctx.sides))
                 if applies(ctx.sides) else [])


def split(sides: Sides) -> bool:
    return sides.towers > 1 and not sides.pairing.same_rows_on_every_tower


REGISTRY: dict[str, Group] = {g.name: g for g in (
    Group("basics", lambda ctx: "configuration, variables, checkpoint, pipelines", always, (
        Check("configuration (flags and what they build)", lambda ctx: [basics.check_config(ctx.sides)]),
        Check("variables", lambda ctx: [basics.check_variables(ctx.sides)]),
        Check("checkpoint round trip", lambda ctx: [basics.check_checkpoint_round_trip(ctx.sides)]),
        Check("input pipelines", lambda ctx: [basics.check_pipelines(ctx.sides)]))),
    Group("structure", lambda ctx: "what each side regularises, averages and trains", always, (
        Check("structure (regularised, averaged, trained)", lambda ctx: [structure.check_structure(ctx.sides)]),)),
    Group("shuffle", lambda ctx: "both training pipelines, shuffled, over two epochs", always, (
        Check("shuffled pipelines (two epochs)", lambda ctx: [shuffle.check_shuffle(ctx.sides)]),)),
    Group("flags", flags_title, not_quick, (
        Check("flags through what they build",
              lambda ctx: [flags.collect(ctx.sides, ctx.started.get("flags"), ctx.log)]),), start=flags_launch),
    Group("forward", lambda ctx: "inference, dropout", always, (
        Check("forward (inference)", lambda ctx: [forward.check_inference(ctx.sides)]),
        Check("dropout (training mode)", lambda ctx: [forward.check_dropout(ctx.sides)]))),
    Group("training", lambda ctx: "training forward pass and gradients", always, (
        Check("training forward pass and gradients", lambda ctx: forward.check_training(ctx.sides)),
        Check("free biases (zero gradient)", lambda ctx: [forward.check_free_variables(ctx.sides)]))),
    Group("splits", lambda ctx: "batch splits", always, (
        split_case("short last batch", lambda s: [splits.check_short(s)], lambda s: True),
        split_case("uneven batch", splits.check_uneven, split),
        split_case("fewer rows than towers", lambda s: [splits.check_fewer(s)], split),
        split_case("a replica the strategy leaves empty", lambda s: [splits.check_empty_replica(s)],
                   lambda s: split(s) and s.towers >= 3))),
    Group("steps", lambda ctx: f"{ctx.settings.restart_steps()} training steps from the legacy state across its "
                               f"schedule", always, (
        Check("training steps", lambda ctx: steps.check_training_steps(ctx.sides, ctx.settings.restart_steps())),)),
    Group("averages", lambda ctx: f"moving averages over {ctx.free_steps} steps", free_steps, (
        Check("moving averages", lambda ctx: averages.check_moving_averages(ctx.sides, ctx.free_steps)),)),
    Group("free", lambda ctx: f"{ctx.free_steps} free-running steps, and the legacy program again from weights "
                              f"1 ulp away", free_steps, (
        Check("free-running steps", lambda ctx: [free.check_free_running(ctx.sides, ctx.free_steps)]),)),
    Group("trained", lambda ctx: "the training checks again from a trained, perturbed state past the schedule",
          always, (
              Check("training checks (trained state)",
                    lambda ctx: trained.check_trained(ctx.sides, ctx.settings, ctx.free_steps)),)),
    Group("evaluation", lambda ctx: "", always, (
        Check("evaluation (one checkpoint)", lambda ctx: [evaluation.check_evaluation(ctx.sides)]),)),
    Group("tf1", lambda ctx: "", not_quick, (Check("legacy on TF1's runtime", tf1_runtime),), start=tf1_launch),
)}
assert tuple(REGISTRY) == GROUPS, "every group in compare.interface.GROUPS, in its order"


def run_groups(ctx: Context, groups: list[str]) -> list[Result]:
    """The checks of `groups` that run under the settings, their results in GROUPS order; first, what
    the groups that run begin beside the others (`Group.start`), those groups' checks run last (they
    collect it), and what is left running is stopped at the end."""
    results: dict[str, list[Result]] = {}
    running = [REGISTRY[name] for name in GROUPS if name in groups and REGISTRY[name].runs(ctx)]
    for group in running:
        if group.start is not None:
            try:
                ctx.started[group.name] = group.start(ctx)
            except OutOfTime:
                raise
            except Exception as error:  # noqa: BLE001 - the group's check reports it, as an ERROR
                ctx.started[group.name] = error
    try:
        for group in sorted(running, key=lambda g: g.start is not None):  # stable: GROUPS order otherwise
            title = group.title(ctx)
            if title:
                ctx.log(f"{ctx.sides.pair.name}: {ctx.sides.label}{title}")
            results[group.name] = [r for check in group.checks for r in run_check(
                check.name, functools.partial(check.run, ctx), ctx.sides.label, ctx.sides.pair.name)]
    finally:
        for begun in ctx.started.values():
            if hasattr(begun, "stop"):
                begun.stop()
    return [r for group in running for r in results[group.name]]


def run_check(name: str, run: Callable[[], list[Result]], label: str, model: str) -> list[Result]:
    """`run()`'s results; its exception as one ERROR result (NotFed: NOT APPLICABLE, with the reason)."""
    try:
        return run()
    except NotFed as reason:
        return [not_applicable(f"{label}{name}", model, str(reason))]
    except OutOfTime:  # a phase of a user's program past the run's limit ends the run (compare.limits)
        raise
    except Exception as error:  # noqa: BLE001 - one check's failure is that check's result, never the run's
        return [error_result(f"{label}{name}", model, error, origin(error))]


HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # compare/


def harness_file(path: str) -> bool:
    """A file of the harness itself (compare/, its adapters in compare/pairs/ aside)."""
    path = os.path.abspath(path)
    return path.startswith(HERE + os.sep) and not path.startswith(os.path.join(HERE, "pairs") + os.sep)


def origin(error: BaseException) -> str:
    """Where `error` came from: the innermost frame outside the harness and outside installed
    packages (the adapter's or the program's), else the innermost frame of the harness."""
    frames = traceback.extract_tb(error.__traceback__)
    prefixes = tuple(p for p in sys.path if "site-packages" in p or "dist-packages" in p) + (sys.prefix,)
    own = [f for f in frames if not harness_file(f.filename) and not os.path.abspath(f.filename).startswith(prefixes)]
    if not own and not frames:
        return ""
    frame = (own or frames)[-1]
    return f"{frame.name} ({os.path.relpath(frame.filename)}:{frame.lineno})"
