"""Every flag both programs accept, at a value other than the harness's, through what each program builds.

For each shared flag (those in `Pair.own_flags` and `Pair.loop_flags` aside, the latter reported with
their reasons), both programs are built again with only that flag changed, and what they build is
compared with what they built before, level by level, the cheap ones first:

  pipeline   the input pipeline alone (LegacySide/ModernSide.input_pipeline): the rows of each step,
             of the validation steps, whether a shuffled epoch starts in file order, whether two builds
             give the same first batch (random preprocessing), its rows' checksum;
  built      the whole program: each dropout's rate, batch norm's decay and epsilon, the optimizer and
             its hyper-parameters, the learning rate at probed steps, the moving averages' decay;
  step       one training step from the common start on fixed rows: its loss, its gradients' norm,
             the moving averages after it.
A flag must change something on BOTH sides (a port that parses a flag and builds from a constant
changes nothing on its side: FAIL, naming the flag and the side), and what changed must agree between
the sides where the two are comparable (the rows of each step, the rates, the schedule).  What a
program builds differently from one build to the next (an unseeded shuffle) is measured by building it
twice with the same flags, and left out.

Where each build takes seconds (a legacy graph of APART_OPERATIONS a tower or more: ResNet-v2-50), the
check runs in a process of its own (compare/flags_process.py), started before the pairing's first
check so that its builds (one core's Python) go on beside the other checks, and its Result is read
back in its place (`launch`, `collect`); a process that fails leaves the check to the harness's.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, NamedTuple
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from compare import common, limits, optimizers, process, report, tf1_graph
from compare.checks.basics import legacy_batches, modern_batches, shuffle_off, tower_dests
from compare.measures import modern_rate_at
from compare.legacy_run import LegacyRun
from compare.modern_run import ModernRun
from compare.report import TensorError, judge, not_applicable
from compare.checks.basics import Rows
from compare.interface import Batch, DataFiles, NotFed, Pair, Pairing, settings
from compare.interface import optional
from compare.report import Result
from compare.sides import Sides, row_key, set_start
from compare.state import Masks, State

tf1 = tf.compat.v1
PIPELINE_STEPS = 200   # at most this many training steps read (a pipeline that repeats forever)
PROBES = (0, 1, 1000, 10 ** 5, 10 ** 6)


class Key(NamedTuple):
    """One entry of a side's fingerprint: what it is (an identifier) and of what (a step, a layer, a
    dropout's index), with the sentence the report shows for it."""
    what: str
    of: Any = None

    @property
    def label(self) -> str:
        return LABELS[self.what].format(self.of)


LABELS = {
    "rows": "rows of each step", "valid_rows": "rows of each validation step",
    "file_order": "a shuffled epoch starts in file order", "same_first_batch": "two builds give the same first batch",
    "checksum": "checksum of the first batch", "dropout_rate": "dropout {} rate", "bn_decay": "{} decay",
    "bn_epsilon": "{} epsilon", "optimizer": "optimizer", "learning_rate": "learning rate at step {}",
    "ema_decay": "moving-average decay at step {}", "loss": "step: loss", "gradients": "step: gradients",
    "shadows": "step: moving averages after",
}
# What both sides' fingerprints say alike where a flag changes them (the rest is each side's own).
COMPARABLE = frozenset({"rows", "valid_rows", "file_order", "learning_rate", "dropout_rate", "ema_decay"})
STEP = frozenset({Key("loss"), Key("gradients")})
ROWS = frozenset({"rows", "valid_rows"})
Fingerprint = dict[Key, Any]


def parse_quietly(parse_args: Callable[[list[str]], Any], argv: Sequence[str]) -> Any:
    """parse_args(argv), or None when the parser refuses it (argparse exits)."""
    import contextlib
    import io
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return parse_args(list(argv))
    except SystemExit:
        return None


def groups_of(argv_lists: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """['--a', '1', '--b', '2', '3'] -> [('--a', '1'), ('--b', '2', '3')] for every argv list."""
    out = []
    for argv in argv_lists:
        for token in argv:
            if token.startswith("--"):
                out.append([token])
            elif out:
                out[-1].append(token)
    return [tuple(g) for g in out]


def automatic_value(dest: str, default: Any) -> Optional[tuple[str, ...]]:
    """An argv that sets `dest` to something other than `default`, from the default's type."""
    flag = "--" + dest
    if isinstance(default, bool):
        return (f"--no-{dest}",) if default else (flag,)
    if isinstance(default, int):
        return flag, str(default * 2 if default else 1)
    if isinstance(default, float):
        return flag, repr(default / 2 if default else 0.5)
    if isinstance(default, list) and default and all(isinstance(v, (int, float)) for v in default):
        return (flag, *[str(type(v)(v * 2)) for v in default])
    return None


def value_for(dest: str, parse: Callable[[Sequence[str]], Any], base_argv: Sequence[str],
              given: Sequence[tuple[str, ...]]) -> tuple[Optional[tuple[str, ...]], Any]:
    """(argv, parsed flags) that change `dest` from its value under `base_argv`: a group of
    Pair.flag_values that does, else one made from the type of the value; (None, None) if neither."""
    base = parse(base_argv)
    for group in given:
        parsed = parse([*base_argv, *group])
        if parsed is not None and getattr(parsed, dest, None) != getattr(base, dest, None):
            return group, parsed
    argv = automatic_value(dest, getattr(base, dest, None))
    parsed = parse([*base_argv, *argv]) if argv else None
    if parsed is not None and getattr(parsed, dest) != getattr(base, dest):
        return argv, parsed
    return None, None


# ---------------------------------------------------------------------------------------------
# What each side builds, by level

def legacy_pipeline(sides: Sides, flags: Any) -> Fingerprint:
    pair = sides.pair
    input_pipeline = optional(pair.legacy, "input_pipeline")
    if input_pipeline is None:
        return {}

    def read(shuffled: bool, seed: int = 0) -> tuple[list[Rows], list[Rows]]:
        graph = tf1.Graph()
        with graph.as_default():
            tf1.set_random_seed(sides.seed + 11 + seed)
            if shuffled:
                pipeline = input_pipeline(flags, sides.towers, sides.files)
            else:
                with shuffle_off():
                    pipeline = input_pipeline(flags, sides.towers, sides.files)
        with tf1.Session(graph=graph) as sess:
            train = legacy_batches(sess, pipeline.train, pipeline.initializer, 1, PIPELINE_STEPS)
            valid = legacy_batches(sess, pipeline.valid, pipeline.valid_initializer, 1, PIPELINE_STEPS) \
                if pipeline.valid else []
        return train, valid
    return describe(read, sides.towers if sides.pairing.same_rows_on_every_tower else 1)


def modern_pipeline(sides: Sides, flags: Any) -> Fingerprint:
    pair = sides.pair
    input_pipeline = optional(pair.modern, "input_pipeline")
    if input_pipeline is None:
        return {}

    def read(shuffled: bool, seed: int = 0) -> tuple[list[Rows], list[Rows]]:
        if shuffled:
            built = input_pipeline(flags, sides.towers, sides.files)
        else:
            with shuffle_off():
                built = input_pipeline(flags, sides.towers, sides.files)
        train, valid = built if isinstance(built, tuple) else (built, None)
        return modern_batches(train, PIPELINE_STEPS), (modern_batches(valid, PIPELINE_STEPS)
                                                       if valid is not None else [])
    return describe(read, 1)


def describe(read: Callable[..., tuple[list[Rows], list[Rows]]], towers_each: int) -> Fingerprint:
    """The pipeline level's fingerprint from `read(shuffled, seed) -> (train batches, valid batches)`."""
    train_off, valid_off = read(False)
    train_again, _ = read(False, seed=1)
    train_on, _ = read(True)
    order = [row_key(x, y) for b in train_off for x, y in zip(b[0], b[1])]
    shuffled = [row_key(x, y) for b in train_on for x, y in zip(b[0], b[1])]
    head = min(32, len(order))
    return {
        Key("rows"): tuple(round(float(np.sum(w)) * towers_each, 6) for _, _, w in train_off),
        Key("valid_rows"): tuple(round(float(np.sum(w)), 6) for _, _, w in valid_off),
        Key("file_order"): shuffled[:head] == order[:head],
        # As sets of rows: towers that each take the next batch of one stream take them in no fixed order.
        Key("same_first_batch"): bool(train_off) and bool(train_again) and sorted(
            row_key(x, y) for x, y in zip(*train_off[0][:2])) == sorted(
            row_key(x, y) for x, y in zip(*train_again[0][:2])),
        Key("checksum"): round(float(np.sum(np.asarray(train_off[0][0], np.float64))), 3) if train_off else None,
    }


def legacy_build(pair: Pair, flags: Any, files: DataFiles, seed: int) -> LegacyRun:
    """The legacy program, built with ONE tower (what a flag builds does not depend on the tower
    count, and a tower less is a build less).  Its variables are not initialised for it (a ResNet-50's
    initializers take seconds; the settings read are constants, or computed from placeholders and the
    global step, which is fed): only where a setting reads another variable, or for the step level
    (`Side.level`)."""
    with shuffle_off():
        return LegacyRun(pair, flags, 1, files, seed, start=False)


def legacy_built(sides: Sides, run: LegacyRun) -> Fingerprint:
    """The built level of the legacy program, read off `run` (closed if that fails)."""
    try:
        try:
            if not run.started:
                run.read_rule()
            return built_fingerprint(sides, run)
        except tf.errors.FailedPreconditionError:  # a setting computed from a variable: initialise them
            run.start()
            return built_fingerprint(sides, run)
    except BaseException:
        run.close()
        raise


def built_fingerprint(sides: Sides, run: LegacyRun) -> Fingerprint:
    batch = one_tower_batch(sides, run, seed=1)
    feed = run.feed(batch, True).feed_dict
    out: Fingerprint = {Key("dropout_rate", run.dropout_index(d)): round(float(run.sess.run(d.rate, feed)), 7)
                        for d in run.dropouts if d.tower == 0}
    decays = run.moving_decays()
    for u in run.moving:
        if u.tower in (0, None):
            out[Key("bn_decay", u.variable.op.name)] = round(decays[u.variable.op.name], 7)
            out[Key("bn_epsilon", u.variable.op.name)] = tf1_graph.batch_norm_epsilon(run.graph, u.value)
    rule = run.rule
    out[Key("optimizer")] = rule_settings(rule)
    out.update({Key("learning_rate", s): run.learning_rate_at(s) for s in PROBES})
    if run.shadows:
        name = sorted(run.shadows)[0]
        _, _, one_minus = tf1_graph.shadow_update(run.graph, run.shadows[name])
        decay = tf1_graph.StepFunction(run.graph, one_minus, run.global_step_var, run.sess)
        out.update({Key("ema_decay", s): round(1 - decay(s), 9) for s in (0, 10 ** 6)})
    return out


def modern_build(pair: Pair, flags: Any, files: DataFiles, legacy: LegacyRun) -> ModernRun:
    """The modern program, built on ONE replica (its variables paired with `legacy`'s)."""
    with shuffle_off():
        return ModernRun(pair, flags, common.make_strategy(1), files, legacy)


def modern_built(run: ModernRun) -> Fingerprint:
    """The built level of the modern program, read off `run`."""
    out: Fingerprint = {Key("dropout_rate", k): round(float(np.float32(layer.rate)), 7)
                        for k, layer in enumerate(run.dropouts)}
    by_id = {id(v): n for n, v in run.names.items()}
    for layer in run.batch_norms:
        name = by_id.get(id(layer.moving_mean), layer.name)
        out[Key("bn_decay", name)] = round(float(np.float32(layer.momentum)), 7)
        out[Key("bn_epsilon", name)] = float(np.float32(layer.epsilon))
    rule = run.rule
    out[Key("optimizer")] = rule_settings(rule) if rule.known else settings_of(run.optimizer)
    out.update({Key("learning_rate", s): float(np.float32(modern_rate_at(run, s))) for s in PROBES})
    return out


def rule_settings(rule: optimizers.Rule) -> tuple[Any, ...]:
    """A known optimizer by its rule and every hyper-parameter the rule uses (in float32, as stored)."""
    return (rule.rule, rule.nesterov, *sorted((k, float(f"{np.float32(v):.7g}")) for k, v in rule.hyper().items()))


def settings_of(optimizer: Any) -> tuple[tuple[str, float], ...]:
    """An optimizer the harness has no rule for, by its public numeric settings (its attributes)."""
    return tuple(sorted((k, round(float(v), 12)) for k, v in vars(optimizer).items()
                        if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)))


def one_tower_batch(sides: Sides, run: LegacyRun, seed: int) -> Batch:
    """Rows for a one-tower build: one tower's rows, or, for a program whose batch-size flag is the
    whole step's (a tf.split of it over the towers), the step's rows."""
    rows = sides.pair.rows_per_tower
    try:
        run.feed(sides.batch(rows=rows, seed=seed), True)
    except NotFed:
        rows *= sides.towers
    return sides.batch(rows=rows, seed=seed)


def step_result(sides: Sides, run: Union[LegacyRun, ModernRun], start: State) -> Fingerprint:
    """One training step from the common start, at a step past any warm-up (10^6) and with the shadows
    moved off the weights, so that their update shows the decay, on fixed rows and fixed dropout masks
    (the legacy towers keep every unit; the port's Dropout layers draw from one seed state, the same in
    every build): its loss, its gradients, the shadows after."""
    state = start.replace(step=10 ** 6)
    if state.shadows:
        state = state.replace(shadows={n: w + np.float32(0.01) for n, w in state.shadows.items()})
    if isinstance(run, LegacyRun):
        if not run.started:
            run.start()
        batch = one_tower_batch(sides, run, seed=12)
        run.restore(state)
        outcome = run.step(batch, fixed(sides, run, batch))
        shadows = run.sess.run(dict(run.shadows)) if run.shadows else {}
    else:
        batch = sides.batch(rows=sides.pair.rows_per_tower, seed=12)  # one replica's rows
        run.restore(state, sides.legacy.learning_rate_at(state.step))
        for k, seed in enumerate(run.seeds):  # the same masks in every build, at the same rate
            dtype = np.dtype(getattr(seed.dtype, "as_numpy_dtype", seed.dtype))
            seed.assign(np.array([sides.seed + 977 + k, 0]).astype(dtype))
        outcome = run.step(batch, before=state)
        shadows = run.shadow_values()
    result: Fingerprint = {Key("loss"): float(outcome.loss),
                           Key("gradients"): {n: np.asarray(g, np.float64) for n, g in outcome.gradients.items()}}
    if shadows:
        result[Key("shadows")] = round(sum(float(np.sum(v)) for v in shadows.values()), 5)
    return result


def moved(key: Key, a: Any, b: Any, tolerance: float) -> bool:
    """Whether `b` differs from `a`: a step's loss and gradients by more than `tolerance` (relative;
    what the forward checks allow two steps that agree), everything else at all."""
    if key.what == "loss" and a is not None and b is not None:
        return not abs(b - a) <= tolerance * max(abs(a), 1e-30)
    if key.what == "gradients" and a is not None and b is not None:
        return step_distance(a, b) > tolerance
    return bool(a != b)


def step_distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """||b - a|| / ||a|| over every gradient (inf where they are not of the same variables)."""
    if set(a) != set(b):
        return math.inf
    diff = math.sqrt(sum(float(np.sum(np.square(b[n] - a[n]))) for n in a))
    norm = math.sqrt(sum(float(np.sum(np.square(a[n]))) for n in a))
    return diff / norm if norm else (0.0 if diff == 0 else math.inf)


def fixed(sides: Sides, run: LegacyRun, batch: Batch) -> Masks:
    """Masks that keep every unit, for a legacy run without dropout noise."""
    if not run.dropouts:
        return None
    feed = run.feed(batch, True).towers
    shapes = {run.dropout_index(d): tuple(d.noise.shape[1:]) for d in run.dropouts if d.tower == 0}
    return [[np.ones((len(r), *shapes[k]), np.float32) for r in feed.rows] for k in sorted(shapes)]


# ---------------------------------------------------------------------------------------------

class Side:
    """One side's fingerprints under some flags, computed level by level on demand; `run`: the side
    built under these flags already, `start`: the common start (for the step level)."""

    def __init__(self, sides: Sides, name: str, flags: Any, start: Callable[[], State],
                 run: Optional[Union[LegacyRun, ModernRun]] = None):
        self.sides, self.name, self.flags, self.start = sides, name, flags, start
        self._levels: dict[str, Fingerprint] = {}
        self._run = run

    def level(self, which: str) -> Fingerprint:
        if which not in self._levels:
            if which == "pipeline":
                self._levels[which] = (legacy_pipeline if self.name == "legacy" else modern_pipeline)(
                    self.sides, self.flags)
            elif which == "built":
                sides = self.sides
                if self.name == "legacy":
                    legacy = self._run if isinstance(self._run, LegacyRun) else legacy_build(
                        sides.pair, self.flags, sides.files, sides.seed)
                    self._run = legacy
                    self._levels[which] = legacy_built(sides, legacy)
                else:
                    modern = self._run if isinstance(self._run, ModernRun) else modern_build(
                        sides.pair, self.flags, sides.files, sides.legacy)
                    self._run = modern
                    self._levels[which] = modern_built(modern)
            else:
                self.level("built")
                assert self._run is not None
                self._levels[which] = step_result(self.sides, self._run, self.start())
        return self._levels[which]

    def close(self) -> None:
        if self._run is not None and self.name == "legacy":
            self._run.close()
            self._run = None


def changed(base: Fingerprint, other: Fingerprint, noisy: set[Key], tolerance: float) -> list[Key]:
    """The entries of `other` that differ from `base` (`moved`), `noisy` ones aside, in the order of
    their labels."""
    return sorted((k for k in other if k not in noisy and moved(k, base.get(k), other.get(k), tolerance)),
                  key=lambda k: k.label)


Sides2 = dict[str, Side]  # "legacy" / "modern" -> that side's fingerprints under some flags


class Changes(NamedTuple):
    """What one flag changes: per side, the entries it changes at the first level where it changes
    any (`found`) and that level (`seen_at`); the sides whose step differs from one build to the next
    under the same flags (`noisy_step`: their step is not judged)."""
    found: dict[str, list[Key]]
    seen_at: dict[str, str]
    noisy_step: list[str]


def first_changes(baseline: Sides2, again: Sides2, trial: Sides2, tolerance: float) -> Changes:
    """Per side, what the trial flags change, at the first level (pipeline, built, step) where they
    change anything, and that level.  The built level is deterministic (settings read off the build);
    the others are measured twice, and what varies from one build to the next is left out."""
    found: dict[str, list[Key]] = {}
    seen_at: dict[str, str] = {}
    noisy_step: list[str] = []
    for level in ("pipeline", "built", "step"):
        for side in ("legacy", "modern"):
            if side in found:
                continue
            noisy = set() if level == "built" else set(
                changed(baseline[side].level(level), again[side].level(level), set(), tolerance))
            if level == "step" and noisy & STEP:
                noisy_step.append(side)
            diff = changed(baseline[side].level(level), trial[side].level(level), noisy, tolerance)
            if diff:
                found[side], seen_at[side] = diff, level
        if len(found) == 2:
            break
    return Changes(found, seen_at, noisy_step)


def disagreements(trial: Sides2, changes: Changes) -> list[str]:
    """What both sides changed where the two are comparable, and do not agree on."""
    differ = []
    found, seen_at = changes.found, changes.seen_at
    for key in set(found.get("legacy", [])) & set(found.get("modern", [])):
        if key.what in COMPARABLE:
            a, b = (trial["legacy"].level(seen_at["legacy"]).get(key),
                    trial["modern"].level(seen_at["modern"]).get(key))
            if key.what in ROWS and a is not None and b is not None:
                # The steps both read: at the end of the data a legacy step whose towers each take the
                # next batch raises OutOfRange as soon as one tower finds none.
                a, b = a[:min(len(a), len(b))], b[:min(len(a), len(b))]
            if a != b:
                differ.append(f"{key.label}: legacy {a} vs modern {b}")
    return differ


def step_moves(baseline: Sides2, trial: Sides2, side: str) -> str:
    """How far the trial flags moved `side`'s step from the baseline's: its loss and its gradients."""
    a, b = baseline[side].level("step"), trial[side].level("step")
    loss_a, loss_b = a[Key("loss")], b[Key("loss")]
    return (f"loss {loss_a:.6g} -> {loss_b:.6g}, gradients moved by "
            f"{step_distance(a[Key('gradients')], b[Key('gradients')]):.2g} (relative L2)")


def judge_flag(argv: Sequence[str], changes: Changes, differ: list[str], baseline: Sides2, trial: Sides2,
               tolerance: float) -> TensorError:
    """One flag's row: what it changes on each side (max_abs, max_rel: how many entries), FAIL (inf)
    where it changes nothing on a side or the sides disagree.  A side whose step it does not move
    while the other's step moves is shown with both steps' numbers."""
    found = changes.found
    missing = [s for s in ("legacy", "modern") if s not in found]
    if len(missing) == 1 and changes.seen_at.get("legacy" if missing == ["modern"] else "modern") == "step":
        side, other = missing[0], "legacy" if missing == ["modern"] else "modern"
        detail = (f"moves the {other} program's step ({step_moves(baseline, trial, other)}) and nothing of the "
                  f"{side} program, its step included ({step_moves(baseline, trial, side)}; tolerance "
                  f"{tolerance:.2g})")
    elif missing:
        detail = (f"changes nothing the {' and '.join(missing)} program builds"
                  + (" or steps" if all(s not in changes.noisy_step for s in missing) else ""))
    elif differ:
        detail = "; ".join(differ[:2])
    else:
        detail = (f"changes {', '.join(k.label for k in found['legacy'][:2])} / "
                  f"{', '.join(k.label for k in found['modern'][:2])}")
    return TensorError(f"{' '.join(argv)}: {detail}", float(len(found.get("legacy", []))),
                       float(len(found.get("modern", []))), 0.0 if not missing and not differ else math.inf)


def base_argv(pair: Pair, pairing: Pairing, towers: int) -> tuple[list[str], list[str]]:
    """The legacy and the modern program's arguments in this pairing (the harness's)."""
    return ([pair.legacy.tower_flag, str(towers), *pair.harness_argv(towers), *pairing.legacy_argv],
            [pair.modern.replica_flag, str(towers), *pair.harness_argv(towers), *pairing.modern_argv])


def check_flags(sides: Sides, baseline_built: bool = False, tolerance: Optional[float] = None) -> Result:
    """See the module docstring.  baseline_built: `sides` are the programs built under the harness's
    flags with one tower, as this check builds them (`apart_sides`, in a process of the check's own),
    taken as its baseline; their start is read when a step level needs it.  tolerance: how far a
    step's loss and gradients may move and still be the same step (default: the pairing's model
    tolerance, what the forward checks allow)."""
    pair, name = sides.pair, f"{sides.label}flags through what they build"
    tolerance = sides.tol.model.rel_l2 if tolerance is None else tolerance
    base_l, base_m = base_argv(pair, sides.pairing, sides.towers)
    parse_l = lambda argv: parse_quietly(pair.legacy.parse_args, argv)  # noqa: E731
    parse_m = lambda argv: parse_quietly(pair.modern.parse_args, argv)  # noqa: E731
    skip = set(pair.own_flags) | set(pair.loop_flags) | tower_dests(pair.legacy.parse_args, pair.legacy.tower_flag) \
        | tower_dests(pair.modern.parse_args, pair.modern.replica_flag)
    shared = sorted((set(settings(parse_l(base_l))) & set(settings(parse_m(base_m)))) - skip)
    if not shared:
        return not_applicable(name, pair.name, "the programs share no flag besides the tower count and those "
                                               "the adapter lists as loop-only or each program's own")
    given = groups_of(pair.flag_values)
    start = functools.cache(lambda: start_of(sides)) if baseline_built else lambda: sides.start

    def sides_under(flags_l: Any, flags_m: Any, built: bool = False) -> Sides2:
        return {"legacy": Side(sides, "legacy", flags_l, start, sides.legacy if built else None),
                "modern": Side(sides, "modern", flags_m, start, sides.modern if built else None)}
    baseline = sides_under(parse_l(base_l), parse_m(base_m), baseline_built)
    again = sides_under(parse_l(base_l), parse_m(base_m))
    errors, notes, opened = [], [], list(baseline.values()) + list(again.values())
    unfed: list[str] = []
    unjudged: list[str] = []  # flags a side's step could not be judged on (it differs from build to build)
    unseen: list[str] = []  # flags that change nothing on either side, its step included
    try:
        for flag in shared:
            argv, flags_l = value_for(flag, parse_l, base_l, given)
            _, flags_m = (argv and (argv, parse_m([*base_m, *argv]))) or (None, None)
            if argv is None or flags_m is None or getattr(flags_m, flag) == getattr(parse_m(base_m), flag):
                errors.append(TensorError(f"--{flag}: no value other than the harness's that both programs take "
                                          f"(give one in Pair.flag_values)", 1.0, 1.0, math.inf))
                continue
            trial = sides_under(flags_l, flags_m)
            opened += list(trial.values())
            try:
                changes = first_changes(baseline, again, trial, tolerance)
                noisy = [s for s in ("legacy", "modern") if s not in changes.found and s in changes.noisy_step]
                row = None if noisy else judge_flag(argv, changes, disagreements(trial, changes), baseline, trial,
                                                    tolerance)
            except NotFed as why:  # this value builds a program no batch of the harness's fits
                unfed.append(f"{' '.join(argv)} ({why})")
                continue
            finally:
                for s in trial.values():
                    s.close()
            if row is None:
                unjudged.append(f"{' '.join(argv)} (the {' and '.join(noisy)} step differs from one build to the "
                                f"next under the same flags)")
                continue
            errors.append(row)
            if not changes.found:
                unseen.append(f"--{flag}")
            notes.append(f"{flag} ({changes.seen_at.get('legacy', '-')}/{changes.seen_at.get('modern', '-')})")
    finally:
        for s in opened:
            s.close()
    loop = ", ".join(f"{f} ({why})" for f, why in sorted(pair.loop_flags.items()))
    if not errors:  # nothing judged is no PASS
        return not_applicable(name, pair.name, f"no shared flag could be judged: "
                                               f"{'; '.join(unfed + unjudged)}")
    # Only a flag that moves neither program, its step included, can be one the training loop alone reads.
    hint = (f"; a flag only the training loop reads is named so (an adapter's loop_flags, or --loop on the "
            f"command line): {', '.join(unseen)}?" if unseen else "")
    failing = [e.name.split(":")[0] for e in errors if e.rel_l2 != 0]
    return judge(name, pair.name, errors, "exact", ok=not failing,
                 note=(f"failing: {', '.join(failing)}; " if failing else "")
                      + f"{len(shared)} shared flags, each changed alone, seen at (legacy/modern): {', '.join(notes)}"
                      f" (a step: its loss and gradients from the same state, rows and dropout masks, moved by more "
                      f"than {tolerance:.2g})"
                      + hint
                      + (f"; not judged here, each for the pair's reason: {loop}" if loop else "")
                      + (f"; not judged, no batch of the harness's fits what they build: {'; '.join(unfed)}"
                         if unfed else "")
                      + (f"; not judged: {'; '.join(unjudged)}" if unjudged else ""))


# ---------------------------------------------------------------------------------------------
# In a process of its own

# A legacy graph of this many operations a tower or more (the harness's own ops in it): each build takes
# seconds (ResNet-v2-50 at two towers: ~8,500 a tower, 4-5 s a one-tower build on one core; at one unit
# per block ~2,700, 1.5 s; the MNIST pair ~240), and the check runs beside the others.  A count, not a
# time: the same pairs take the same path on every machine.
APART_OPERATIONS = 6000


class Apart(NamedTuple):
    """This check, started in a process of its own (compare/flags_process.py): where it writes."""
    started: process.Started
    out_path: str

    def stop(self) -> None:
        self.started.stop()


def launch(sides: Sides) -> Optional[Apart]:
    """This check started in a process of its own, beside the pairing's other checks, where its
    builds take seconds each (a legacy graph of APART_OPERATIONS a tower or more) and the pair can be
    loaded again there (from its adapter module); None where it runs in the harness's process.  The
    process builds the programs under the harness's flags for its baseline, its programs' outputs go to
    a scratch folder of its own, and the common start is read from the start checkpoint."""
    if not sides.pair.module or len(sides.legacy.graph.get_operations()) < APART_OPERATIONS * sides.towers:
        return None
    stem = os.path.join(sides.tmp_dir, f"{sides.pair.name}{'_' + sides.pairing.label if sides.pairing.label else ''}"
                                       f"_flags")
    files = dict(sides.files, scratch=stem + "_scratch")
    os.makedirs(files["scratch"], exist_ok=True)
    meta = {"adapter": sides.pair.module, "programs": dict(sides.pair.programs), "pairing": sides.pairing.label,
            "same_rows": sides.pairing.same_rows_on_every_tower, "towers": sides.towers, "seed": sides.seed,
            "files": files, "tmp_dir": sides.tmp_dir, "start": sides.start_path,
            "tolerance": sides.tol.model.rel_l2, "seconds": limits.seconds()}
    with open(stem + "_in.json", "w") as f:
        json.dump(meta, f)
    return Apart(process.start("compare.flags_process", [stem + "_in.json", stem + "_out.json"], stem + ".log"),
                 stem + "_out.json")


def collect(sides: Sides, begun: Any, log: Callable[[str], None]) -> Result:
    """This check's result, read back from the process `launch` began; run here where none was begun,
    or where it failed (the progress log says how)."""
    if isinstance(begun, Apart):
        code = begun.started.wait(timeout=3600)  # each of its builds has the run's limit there
        line = limits.own_line(begun.started.log_path) if code == limits.EXIT_STATUS else None
        if line:
            limits.out_of_time(line)
        if code == 0 and os.path.exists(begun.out_path):
            return report.read_json(begun.out_path)[0]
        log(f"{sides.pair.name}: {sides.label}the flags check's own process ended with exit code {code} "
            f"({begun.started.last_line()[:200]}): the check runs here")
    elif isinstance(begun, BaseException):
        log(f"{sides.pair.name}: {sides.label}the flags check's own process could not start "
            f"({type(begun).__name__}: {begun}): the check runs here")
    return check_flags(sides)


def apart_sides(pair: Pair, pairing: Pairing, towers: int, files: DataFiles, tmp_dir: str, seed: int,
                start_path: str) -> Sides:
    """In the check's own process: the programs built under the harness's flags, as the check builds
    them (one tower, one replica), for `check_flags(sides, baseline_built=True)`."""
    base_l, base_m = base_argv(pair, pairing, towers)
    legacy = legacy_build(pair, pair.legacy.parse_args(base_l), files, seed)
    try:
        modern = modern_build(pair, pair.modern.parse_args(base_m), files, legacy)
    except BaseException:
        legacy.close()
        raise
    return Sides(pair, pairing, towers, legacy, modern, files, tmp_dir, seed, start_path=start_path)


def start_of(sides: Sides) -> State:
    """The common start, read from the start checkpoint the harness wrote (`sides.start_path`) through
    the legacy program built here."""
    if not sides.legacy.started:
        sides.legacy.start()
    set_start(sides, None, sides.start_path)
    return sides.start
