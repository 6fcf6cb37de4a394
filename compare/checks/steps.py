"""Training steps from shared states, across the learning-rate schedule.

Before every step the modern model and optimizer are set to the legacy program's state (weights,
moving statistics, optimizer slots, step counter; TF1's Adam beta powers to beta^(step + 1)), both
take one step on the same rows with the same dropout masks, and then:

  lr         the legacy learning-rate tensor against the rate the modern optimizer used;
  loss, gradients   legacy grads_and_vars against the modern step's;
  optimizer  each side's update and slots against its own rule (compare.optimizers), from its
             own slots, gradient and rate: legacy and modern updates are not compared directly
             (Adam divides each element by its own size: where a gradient is ~0, a round-off
             difference in g is a full +-lr difference in the step);
  counters   global step and iterations both +1; TF1's running beta powers = beta^t;
  moving statistics (when UPDATE_OPS moves any): EXPECTED, see check_moving_statistics.

The global steps are chosen from the legacy schedule itself: the steps where its rate changes
(found by probing the graph's learning-rate tensor), each boundary b and b + 1, far past the last.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Optional, Sequence

import numpy as np

from compare import causes, counterfactuals, diagnosis, modern_run, optimizers, tf1_graph
from compare.checks.forward import gradient_judge
from compare.interface import Batch
from compare.legacy_run import LegacyRun
from compare.measures import change_error, gradient_errors, modern_rate_at, rate
from compare.report import EPS32, Diagnosis, Part, Result, TensorError, judge, not_applicable, tensor_error
from compare.sides import Sides
from compare.state import Arrays, State, StepOutcome

HORIZON = 2 ** 22  # the schedule is probed up to this global step


def change_points(legacy: LegacyRun, limit: int = 16) -> Optional[list[int]]:
    """The global steps s at which the legacy rate changes (lr(s) != lr(s + 1)), up to HORIZON; None
    when it changes at almost every step (a continuous decay)."""
    probes = [0] + [2 ** k for k in range(23)]
    cache = {}

    def lr(s: int) -> float:
        if s not in cache:
            cache[s] = legacy.learning_rate_at(s)
        return cache[s]
    found = []
    for a, b in zip(probes, probes[1:]):
        if lr(a) == lr(b):
            continue
        lo, hi = a, b  # lr(lo) != lr(hi): the first change in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if lr(mid) != lr(lo) else (mid, hi)
        found.append(lo)
        if len(found) > limit:
            return None
    continuous = sum(lr(s) != lr(s + 1) for s in (3, 17, 1001, 40009)) >= 3
    return None if continuous else found


def schedule_probes(points: Optional[Sequence[int]]) -> list[int]:
    """Global steps at which both schedules are read without training: 0, 1, each change point and
    the step after it, and powers of ten up to 10^6."""
    probes = [0, 1] + [s + k for s in (points or [])[:8] for k in (0, 1)] + [10 ** k for k in range(2, 7)]
    return sorted(set(probes))


def restart_steps(points: Optional[list[int]], count: int) -> list[int]:
    """`count` global steps for the restart check: for a stepwise schedule the first boundary b0 (a
    schedule one step ahead shows there), the last boundary + 1 (one step behind), b0 + 1, far past the
    last, the other crossings, step 0; for a continuous or constant one, 0, far, 1 and between."""
    if points:
        far = 4 * points[-1] + 4
        wanted = [points[0], points[-1] + 1, points[0] + 1, far] + [b + k for b in points[1:-1] for k in (0, 1)] \
            + points[1:] + [b + 1 for b in points[:-1]] + [0]
    else:
        far = 100000
        wanted = [0, far, 1, far // 4, far // 2]
    wanted = list(dict.fromkeys(wanted))
    while len(wanted) < count:
        wanted.append(far + len(wanted))
    return sorted(wanted[:count])


@dataclasses.dataclass
class RestartStep:
    """One restart step: the state both sides started from, each side's outcome and state after."""
    step: int
    before: State
    lr_state: float              # the legacy rate at the state's step (the modern slots' conversion)
    legacy: StepOutcome
    modern: StepOutcome
    legacy_after: State
    modern_weights: Arrays       # the modern trainable weights after the step
    modern_slots: dict[str, Arrays]
    modern_slots_before: dict[str, Arrays]  # the port's slots the step started from (its own names)
    iterations: int              # the modern optimizer's iterations after the step
    modern_moving: Arrays        # the modern moving statistics after the step
    powers: tuple[float, ...] = ()  # the legacy beta powers after the step (Adam)
    # The port's optimizer on the legacy gradient from `before` (optimizers side by side): its weights and slots.
    port_weights: Arrays = dataclasses.field(default_factory=dict)
    port_slots: dict[str, Arrays] = dataclasses.field(default_factory=dict)
    batch: Optional[Batch] = None  # the rows the step was given (a diagnosis runs the original on them again)
    # What the step checks measure of this step (`measure`), as soon as it is made.
    side_by_side: list[TensorError] = dataclasses.field(default_factory=list)
    legacy_rule: list[TensorError] = dataclasses.field(default_factory=list)
    modern_rule: Optional[list[TensorError]] = None  # None: the port's rule implied at this step (`implied`)
    loss_error: Optional[TensorError] = None
    gradient_errors: list[TensorError] = dataclasses.field(default_factory=list)

    def parts(self, sides: Sides) -> bool:
        """Whether any tensor of this step measured so far parts beyond its check's tolerance."""
        optimizer, model = sides.tol.optimizer.rel_l2, sides.tol.model.rel_l2
        return (any(not e.rel_l2 <= e.limit(optimizer) for e in
                    self.side_by_side + self.legacy_rule + (self.modern_rule or []))
                or any(not e.rel_l2 <= e.limit(model) for e in [self.loss_error, *self.gradient_errors] if e))

    def lighten(self, moving: Sequence[str]) -> None:
        """Drop the whole-model arrays, once measured, keeping what the checks read later: the loss
        and rate of each side, the moving statistics (`moving`, their names) before and after, the
        counters.  A step that parts keeps everything, for the diagnosis."""
        def light(state: State) -> State:
            return State({n: state.weights[n] for n in moving if n in state.weights}, {}, state.step, None)
        self.before, self.legacy_after = light(self.before), light(self.legacy_after)
        self.legacy = dataclasses.replace(self.legacy, gradients={})
        self.modern = dataclasses.replace(self.modern, gradients={})
        self.modern_weights, self.modern_slots, self.modern_slots_before = {}, {}, {}
        self.port_weights, self.port_slots = {}, {}


def run_restart_step(sides: Sides, k: int, step: int, state: State) -> RestartStep:
    """Both sides from `state` (its step set to `step`), one step on the same rows and masks."""
    legacy, modern = sides.legacy, sides.modern
    names = list(legacy.trainable)
    lr_state = sides.set_both(state)
    slots_before = modern.slot_values(names)
    batch = sides.batch(seed=100 + k)
    out_m = modern.step(batch, before=state)
    out_l = legacy.step(batch, sides.masks_for(batch, out_m))
    powers = tuple(legacy.sess.run([legacy.powers["beta1_power"], legacy.powers["beta2_power"]])) \
        if legacy.powers else ()
    return RestartStep(step, state, lr_state, out_l, out_m, legacy.state(), modern.weights(names),
                       modern.slot_values(names), slots_before, modern.iterations(),
                       modern.weights(sorted({u.variable.op.name for u in legacy.moving})), powers, batch=batch)


def optimizer_errors(sides: Sides, r: RestartStep, legacy: bool = True, modern: bool = True) -> list[TensorError]:
    """Each side's update and slots of every variable against its own rule (compare.optimizers),
    where the harness knows that rule (the legacy program's where `legacy`, the port's where `modern`)."""
    rule_l, rule_m = sides.legacy.rule, sides.modern.rule
    names = list(sides.legacy.trainable)
    tol = sides.tol.optimizer.rel_l2
    b1p, b2p = np.float32(rule_l.beta1) ** (r.step + 1), np.float32(rule_l.beta2) ** (r.step + 1)
    t = np.float32(r.iterations)
    powers_m = (float(np.float32(rule_m.beta1) ** t), float(np.float32(rule_m.beta2) ** t))

    def legacy_update(n: str) -> list[TensorError]:
        return [dataclasses.replace(e, step=r.step, variable=n) for e in optimizers.update_errors(
            f"legacy step {r.step}: {n}", rule_l, dict(r.before.slots[n], w=r.before.weights[n]),
            dict(r.legacy_after.slots[n], w=r.legacy_after.weights[n]), r.legacy.gradients[n], rate(r.legacy),
            (float(b1p), float(b2p)), tol)]

    def modern_update(n: str) -> list[TensorError]:
        return [dataclasses.replace(e, step=r.step, variable=n) for e in optimizers.update_errors(
            f"modern step {r.step}: {n}", rule_m, dict(r.modern_slots_before[n], w=r.before.weights[n]),
            dict(r.modern_slots[n], w=r.modern_weights[n]), r.modern.gradients[n], rate(r.modern), powers_m, tol)]

    jobs = ([(legacy_update, n) for n in names] if rule_l.known and legacy else []) \
        + ([(modern_update, n) for n in names] if rule_m.known and modern else [])
    return [e for update, n in jobs for e in update(n)]


def counter_errors(sides: Sides, r: RestartStep) -> tuple[list[TensorError], list[TensorError]]:
    """(the step counters, each +1 exactly; TF1's running beta powers = beta^t)."""
    exact = [tensor_error(f"step {r.step}: legacy global step", np.float64(r.legacy_after.step),
                          np.float64(r.step + 1), step=r.step),
             tensor_error(f"step {r.step}: modern iterations", np.float64(r.iterations), np.float64(r.step + 1),
                          step=r.step)]
    powers = []
    if r.powers:
        rule = sides.legacy.rule
        powers.append(tensor_error(f"step {r.step}: legacy beta powers", np.array(r.powers, np.float64),
                                   np.array([rule.beta1, rule.beta2], np.float32) ** np.float64(r.step + 2),
                                   step=r.step))
    return exact, powers


def check_training_steps(sides: Sides, count: int, steps_at: Optional[list[int]] = None,
                         start: Optional[State] = None, suffix: str = "") -> list[Result]:
    """See the module docstring; the first step starts from the common start (or `start`), each
    later one from where the legacy program's previous step left it."""
    legacy = sides.legacy
    points = change_points(legacy)
    steps_at = steps_at or restart_steps(points, count)
    moving = sorted({u.variable.op.name for u in legacy.moving})
    runs: list[RestartStep] = []
    for k, step in enumerate(steps_at):
        state = (runs[-1].legacy_after if k else (start or sides.start)).replace(step=step)  # where it left it
        runs.append(measure(sides, run_restart_step(sides, k, step, state)))
        if k and not runs[-2].parts(sides):  # its state after is this step's start: dropped once this step is made
            runs[-2].lighten(moving)
    if not runs[-1].parts(sides):
        runs[-1].lighten(moving)
    kinds = {"learning rate": check_lr(sides, runs, points, suffix),
             "loss and gradients": check_losses_and_gradients(sides, runs, suffix),
             "own rule": check_own_rules(sides, runs, suffix),
             "side by side": check_port_optimizer(sides, runs, suffix),
             "step counters": check_counters(sides, runs, suffix)}
    if legacy.moving:
        kinds["moving statistics"] = check_moving_statistics(sides, runs, suffix)
    if any(r.status == "FAIL" for r in kinds.values()):
        diagnose_steps(sides, runs, kinds, points)
    return list(kinds.values())


# ---------------------------------------------------------------------------------------------
# Where the steps part, and why

# The variable groups of one step, in the order a step computes them (the rate and the gradients
# feed the update of the weights and slots; the moving statistics and the counters move beside it).
STEP_GROUPS = ("learning rate", "loss and gradients", "weights", "slots", "moving statistics", "step counters",
               "own rule")


def step_parts(kinds: dict[str, Result]) -> list[Part]:
    """One Part per (step, variable group) that the step checks compared, in step order, then group
    order: the worst tensor of the group at that step against its own tolerance."""
    found: dict[tuple[int, int], tuple[float, TensorError, float]] = {}
    for kind, result in kinds.items():
        check = result.tolerance.rel_l2
        for e in result.errors:
            if e.step is None or e.probe:
                continue
            group = ("weights" if e.slot is None else "slots") if kind == "side by side" else kind
            key = (e.step, STEP_GROUPS.index(group))
            limit = e.limit(check)
            ratio = e.rel_l2 / limit if limit > 0 else (0.0 if e.rel_l2 == 0 else np.inf)
            if key not in found or ratio > found[key][0]:
                found[key] = (ratio, e, limit)
    return [Part(f"step {step}: {STEP_GROUPS[group]}", e.rel_l2, limit, note=e.name, step=step)
            for (step, group), (_, e, limit) in sorted(found.items())]


def rates_part(result: Result) -> str:
    """Where the rates of the lr check first part, in global-step order (restart steps and probes)."""
    check = result.tolerance.rel_l2
    failing = sorted(((e.step, e) for e in result.errors if e.step is not None and e.rel_l2 > e.limit(check)),
                     key=lambda pair: pair[0])
    if not failing:
        return "no rate parts"
    step, e = failing[0]
    return (f"the rates first part at global step {step} ({e.name}: {e.rel_l2:.3g} against {e.limit(check):.3g}); "
            f"{len(failing)} of {len(result.errors)} rates compared part")


def diagnose_steps(sides: Sides, runs: list[RestartStep], kinds: dict[str, Result],
                   points: Optional[list[int]]) -> None:
    """Each FAIL of the step checks gets where the steps first part (the first step, then the first
    variable group) and the catalogue's likely cause for what it compares."""
    def where() -> tuple[str, list[Part]]:
        parts = step_parts(kinds)
        i = diagnosis.first_parting(parts)
        if i is None:
            return "no step's variable group parts beyond its tolerance", parts
        p = parts[i]
        steps_before = sorted({q.step for q in parts[:i] if q.step is not None and q.step != p.step})
        return (f"first at {p.name} ({p.note}: {p.error:.3g} against {p.tolerance:.3g})"
                + (f"; steps {steps_before} agree" if steps_before else "; it is the first step compared"), parts)

    def first_failing(kind: str) -> Optional[RestartStep]:
        """The first step at which a check's tensors part."""
        result = kinds[kind]
        for r in runs:
            if any(e.rel_l2 > e.limit(result.tolerance.rel_l2) for e in result.errors if e.step == r.step):
                return r
        return None

    def optimizer_cause() -> str:
        r = first_failing("side by side")
        return causes.explain_optimizer(sides, r) if r is not None else causes.unexplained([])

    def gradient_cause() -> str:
        r = first_failing("loss and gradients")
        if r is None or r.batch is None:
            return causes.unexplained([])
        symptom = counterfactuals.Symptom(r.before, r.batch, r.legacy.masks, r.legacy.loss,
                                          r.legacy.gradients, r.modern.loss, r.modern.gradients)
        return counterfactuals.explain(sides, symptom, lambda: causes.explain_gradients(
            sides, r.legacy.gradients, r.modern.gradients, r.before.weights, gradient_judge(sides, r.legacy.gradients)))

    causes_of: dict[str, Callable[[], str]] = {
        "learning rate": lambda: causes.explain_schedule(sides, [r.step for r in runs] + schedule_probes(points)),
        "loss and gradients": gradient_cause,
        "side by side": optimizer_cause,
        "moving statistics": lambda: explain_moving_statistics(sides, runs),
    }
    line: Optional[str] = None
    parts: list[Part] = []
    for kind, result in kinds.items():
        if result.status != "FAIL":
            continue
        if line is None:
            line, parts = where()

        def localise(kind: str = kind, line: Optional[str] = line, parts: list[Part] = parts) -> Diagnosis:
            cause = causes_of.get(kind, lambda: causes.unexplained([]))()
            if kind == "learning rate":  # the rates are compared at probed steps too: the first that parts
                return Diagnosis(rates_part(kinds[kind]), cause, parts, "steps")
            return Diagnosis(line or "", cause, parts, "steps")
        diagnosis.guarded(result, localise)


def implied(sides: Sides, r: RestartStep) -> bool:
    """Whether the port's update at step `r` follows its own rule by implication: it is the legacy
    program's rule (hyper-parameters aside), the port's update agrees with the legacy one side by side
    at this step, and the legacy update is judged against that rule."""
    tol = sides.tol.optimizer.rel_l2
    return (optimizers.same_rule(sides.legacy.rule, sides.modern.rule) and bool(r.side_by_side)
            and all(e.rel_l2 <= e.limit(tol) for e in r.side_by_side))


def measure(sides: Sides, r: RestartStep) -> RestartStep:
    """Everything the step checks compare of step `r`, measured as soon as it is made (whole-model
    arrays are not kept past the next step: `RestartStep.lighten`): the port's optimizer on the
    legacy gradient, each side's update against its own rule (the port's where not implied), the
    loss and gradients."""
    r.side_by_side = port_on_legacy_gradient(sides, r)
    r.legacy_rule = optimizer_errors(sides, r, legacy=True, modern=False)
    r.modern_rule = None if implied(sides, r) else optimizer_errors(sides, r, legacy=False, modern=True)
    r.loss_error = tensor_error(f"loss at step {r.step}", r.legacy.loss, r.modern.loss, step=r.step)
    r.gradient_errors = [dataclasses.replace(e, name=f"step {r.step}: {e.name} gradient", step=r.step)
                         for e in gradient_errors(sides, r.legacy.gradients, r.modern.gradients)]
    return r


def check_own_rules(sides: Sides, runs: list[RestartStep], suffix: str) -> Result:
    """Each side's optimizer against its own rule, where the harness knows it; the port's at the steps
    where side by side does not imply it (`implied`)."""
    rule_l, rule_m = sides.legacy.rule, sides.modern.rule
    name = f"{sides.label}{len(runs)} training step{plural(runs)}: optimizer on each side{suffix}"
    if not rule_l.known and not rule_m.known:
        return not_applicable(name, sides.pair.name, f"the harness knows neither rule (legacy {rule_l.describe()}, "
                                                     f"modern {rule_m.describe()}): the two are judged against each "
                                                     f"other (the port's optimizer on the legacy gradient)")
    own_steps = [r.step for r in runs if r.modern_rule is not None]
    judged = [("legacy", rule_l)] + ([("modern", rule_m)] if own_steps else [])
    own = [f"{side} {rule.describe()}" for side, rule in judged if rule.known]
    other = [f"{side} {rule.describe()}" for side, rule in (("legacy", rule_l), ("modern", rule_m)) if not rule.known]
    errors = [e for r in runs for e in r.legacy_rule + (r.modern_rule or [])]
    note = f"every variable's update and slots against its own rule: {', '.join(own)}"
    if rule_m.known and len(own_steps) < len(runs):
        note += ("; the port's by implication" + (f" at the other steps than {own_steps}" if own_steps else "")
                 + ": the same rule, and its update agrees with the legacy one side by side")
    if other:
        note += f"; {', '.join(other)}: judged against the other side only (optimizers side by side)"
    return judge(name, sides.pair.name, errors, sides.tol.optimizer, note=note)


def port_on_legacy_gradient(sides: Sides, r: RestartStep) -> list[TensorError]:
    """The port's optimizer given what the legacy update was given (the state the step started
    from, the legacy gradient), against what the legacy update made of it: each variable's update and
    the slots the two keep alike (by conversion, or by the pairing found by value for a rule the
    harness does not know)."""
    legacy, modern = sides.legacy, sides.modern
    names = list(legacy.trainable)
    modern.restore(r.before, r.lr_state)
    if modern.pairing is None and not modern.rule.known:
        for n in names:  # the port's own initial slots: nothing pairs them with the legacy ones yet
            for key, value in modern.fresh_slots[n].items():
                modern_run.assign_everywhere(modern.slots[n][key], value)
    modern.apply({n: r.legacy.gradients[n] for n in names})
    after_w, after_s = modern.weights(names), modern.slot_values(names)
    if modern.pairing is None and not modern.rule.known:
        modern.pairing = find_pairing(sides, r, after_s)
    r.port_weights, r.port_slots = after_w, after_s
    tol = sides.tol.optimizer.rel_l2
    jobs: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, str, Optional[str]]] = []
    for n in names:
        jobs.append((f"step {r.step}: {n} update", r.before.weights[n], after_w[n], r.legacy_after.weights[n], n, None))
        converted = modern.legacy_slots_of(after_s[n])
        jobs += [(f"step {r.step}: {n} {key}", r.before.slots[n][key], converted[key], r.legacy_after.slots[n][key],
                  n, key) for key in sorted(set(converted) & set(r.legacy_after.slots[n]))]
    return [change_error(*job[:4], tol, step=r.step, variable=job[4], slot=job[5]) for job in jobs]


def find_pairing(sides: Sides, r: RestartStep, after: dict[str, Arrays]) -> Optional[dict[str, str]]:
    """modern slot -> legacy slot, the same for every variable, where each pair holds the same values
    after the step (within the optimizer tolerance); None if no such pairing."""
    tol = sides.tol.optimizer.rel_l2
    names = list(sides.legacy.trainable)
    first = names[0]

    def close(a: np.ndarray, b: np.ndarray) -> bool:
        return tensor_error("", a, b).rel_l2 <= 64 * tol

    pairing = optimizers.pair_slots(r.legacy_after.slots[first], after[first], close)
    if pairing is None:
        return None
    ok = all(close(after[n][m], r.legacy_after.slots[n][legacy]) for n in names for m, legacy in pairing.items())
    return pairing if ok else None


def check_port_optimizer(sides: Sides, runs: list[RestartStep], suffix: str) -> Result:
    """The port's optimizer on the legacy gradient from the legacy state, against the legacy update."""
    name = f"{sides.label}{len(runs)} training step{plural(runs)}: optimizers side by side{suffix}"
    errors = [e for r in runs for e in r.side_by_side]
    modern = sides.modern
    slots = ("slots converted" if modern.rule.known else
             f"slots paired by value ({', '.join(f'{m} = {l}' for m, l in modern.pairing.items())})" if modern.pairing
             else "no slot pairs by value: updates only")
    return judge(name, sides.pair.name, errors, sides.tol.optimizer,
                 note=f"legacy {sides.legacy.rule.describe()} vs modern {modern.rule.describe()}, each variable's "
                      f"update from the same state on the same gradient; {slots}")


def plural(runs: list[RestartStep]) -> str:
    return "s" if len(runs) != 1 else ""


def check_lr(sides: Sides, runs: list[RestartStep], points: Optional[list[int]], suffix: str) -> Result:
    """The rate each step used, and both schedules probed without training."""
    legacy, modern = sides.legacy, sides.modern
    errors = [tensor_error(f"lr at step {r.step}", np.float32(r.modern.lr), np.float32(r.legacy.lr), step=r.step)
              for r in runs]
    probes = schedule_probes(points) if not suffix else []
    errors += [tensor_error(f"lr at step {s} (probed)", np.float32(modern_rate_at(modern, s)),
                            np.float32(legacy.learning_rate_at(s)), step=s, probe=True) for s in probes]
    schedule = ("continuous" if points is None else f"changes after steps {points}" if points else "constant")
    return judge(f"{sides.label}lr schedule{suffix}", sides.pair.name, errors,
                 sides.tol.schedule if points is None else "exact",
                 note=f"the rate each step used, at global steps {[r.step for r in runs]}, and the schedules probed "
                      f"at {probes}; the legacy schedule {schedule}")


def check_losses_and_gradients(sides: Sides, runs: list[RestartStep], suffix: str) -> Result:
    errors = [r.loss_error for r in runs if r.loss_error] + [e for r in runs for e in r.gradient_errors]
    return judge(f"{sides.label}{len(runs)} training step{plural(runs)}: loss and gradients{suffix}", sides.pair.name,
                 errors, sides.tol.model,
                 note=f"each step from the legacy state; modern gradients {runs[-1].modern.source}",
                 extra={"losses": {"legacy": [r.legacy.loss for r in runs], "modern": [r.modern.loss for r in runs]}})


def check_counters(sides: Sides, runs: list[RestartStep], suffix: str) -> Result:
    exact, powers = [], []
    for r in runs:
        e, p = counter_errors(sides, r)
        exact += e
        powers += p
    ok = all(e.max_abs == 0 for e in exact) and all(e.max_rel <= 64 * EPS32 for e in powers)
    return judge(f"{sides.label}step counters{suffix}", sides.pair.name, exact + powers, "exact", ok=ok,
                 note="legacy global step and modern iterations +1 per step"
                      + ("; TF1's running beta powers = beta^t (64 eps32)" if sides.legacy.powers else ""))


# ---------------------------------------------------------------------------------------------
# Batch-norm moving statistics

def schedules(n: int) -> list[tuple[tuple[int, ...], tuple[frozenset[int], ...]]]:
    """The distinct ways n unordered read-modify-write updates of one variable can interleave.

    Update i reads v, computes delta_i = (v_read - a_i)(1 - d), and atomically subtracts it
    (AssignSubVariableOp).  Which earlier subtractions update i's read sees is a set S_i; a schedule
    is one consistent choice of S_0..S_n-1 over all orders of the 2n read/write events.  Returns a
    list of (order of reads, tuple of S_i) with duplicates removed.
    """
    events = [(i, kind) for i in range(n) for kind in "rw"]
    seen, out = set(), []
    for perm in itertools.permutations(range(2 * n)):
        order = [events[p] for p in perm]
        if any(order.index((i, "r")) > order.index((i, "w")) for i in range(n)):
            continue
        done: set[int] = set()
        sets: dict[int, frozenset[int]] = {}
        reads: list[int] = []
        for i, kind in order:
            if kind == "r":
                sets[i] = frozenset(done)
                reads.append(i)
            else:
                done.add(i)
        key = tuple(sets[i] for i in range(n))
        if key not in seen:
            seen.add(key)
            out.append((tuple(reads), key))
    return out


_SCHEDULES: dict[int, list[tuple[tuple[int, ...], tuple[frozenset[int], ...]]]] = {}


def predictions_legacy(before: np.ndarray, stats: Sequence[np.ndarray], decay: float) -> list[np.ndarray]:
    """Every value n unordered updates (one per schedule) can leave in a shared variable:
    v_after = v - sum_i (v_read_i - a_i)(1 - d)."""
    n = len(stats)
    if n not in _SCHEDULES:
        _SCHEDULES[n] = schedules(n)
    preds = []
    for reads, sets in _SCHEDULES[n]:
        delta: dict[int, np.ndarray] = {}
        for i in reads:
            delta[i] = (before - sum(delta[j] for j in sets[i]) - stats[i]) * (1 - decay)
        preds.append(before - sum(delta.values()))
    return preds


def moving_groups(legacy: LegacyRun) -> dict[str, list[int]]:
    """{variable name: [indices into legacy.moving]}: the updates of each moving statistic, in tower order."""
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(legacy.moving):
        groups.setdefault(u.variable.op.name, []).append(i)
    return {n: sorted(ix, key=lambda i: legacy.moving[i].tower or 0) for n, ix in groups.items()}


def check_moving_statistics(sides: Sides, runs: list[RestartStep], suffix: str = "") -> Result:
    """EXPECTED (more than one update per shared statistic): legacy moves each moving statistic once per
    tower per step; the modern model once, by the replicas' mean.

    Predictions, from the batch statistics a_i the legacy towers' updates read (tapped in the legacy
    step; the modern replicas' equal them, by the training-forward check) and the value v before:
      legacy:  one of `predictions_legacy` (n unordered updates of one shared variable); for a
               replica-local statistic (a MirroredStrategy's batch norm: each replica moves its own
               copy, read as the copies' mean) v - (v - mean_i a_i)(1 - d)
      modern:  v - (v - mean_i a_i)(1 - d), on every replica's copy alike
    with the legacy graph's own decay d.  Compared as the update (after - before), relative to its
    own size, with a floor: each side stores v in float32 after up to n + 1 roundings, and computes
    each a_i with its own kernel, so n + 1 ulps of v and 4 (1 - d) ulps of each a_i per element count
    as exactly the tolerance.  With n > 1 updates of a shared statistic the modern update would FAIL
    the legacy prediction and vice versa (the gap is in the note); replica-local statistics are
    predicted alike on both sides, and PASS.
    """
    legacy, modern, tol = sides.legacy, sides.modern, sides.tol.model
    groups = moving_groups(legacy)
    decay = legacy.moving_decays()
    local = {n for n in groups if n in legacy.mirrors and legacy.mirrors[n].on_read}
    n_updates = max((len(ix) for n, ix in groups.items() if n not in local), default=0)
    plain = causes.MovingVariant()
    errors: list[TensorError] = []
    seen: dict[int, int] = {}
    gaps: list[float] = []
    for r in runs:
        before, after_l, after_m, stats, step = (r.before.weights, r.legacy_after.weights, r.modern_moving,
                                                 r.legacy.stats, r.step)
        for name, ix in sorted(groups.items()):
            v = np.asarray(before[name], np.float64)
            a = [np.asarray(stats[i], np.float64) for i in ix]
            floor = moving_floor(before[name], [stats[i] for i in ix], decay[name], tol.rel_l2)
            modern_pred = modern_moving(v, a, decay[name], plain, None)
            if name in local:
                errors.append(tensor_error(f"legacy {name} step {step} (replica copies' mean)", after_l[name] - v,
                                           modern_pred - v, floor, step=step, variable=name))
            else:
                preds = predictions_legacy(v, a, decay[name])
                scored = [tensor_error("", after_l[name] - v, p - v, floor).rel_l2 for p in preds]
                best = int(np.argmin(scored))
                seen[best] = seen.get(best, 0) + 1
                errors.append(tensor_error(f"legacy {name} step {step} (schedule {best})", after_l[name] - v,
                                           preds[best] - v, floor, step=step, variable=name))
                if len(ix) > 1:
                    gaps.append(tensor_error("", modern_pred - v, preds[best] - v, floor).rel_l2)
            errors.append(tensor_error(f"modern {name} step {step}", after_m[name] - v, modern_pred - v, floor,
                                       step=step, variable=name))
            copies = [np.asarray(c) for c in modern_run.replica_copies(modern.names[name])]
            if len(copies) > 1:
                errors.append(tensor_error(f"modern {name} step {step}: replica copies equal", np.stack(copies),
                                           np.stack([copies[0]] * len(copies)), step=step, variable=name))
    distinct = not gaps or min(gaps) > tol.rel_l2
    ok = distinct and all(e.rel_l2 <= tol.rel_l2 for e in errors)
    shared = len(groups) - len(local)
    parts = []
    if shared:
        parts.append(f"{n_updates} unordered update(s) of each of {shared} shared statistics per step "
                     f"({len(_SCHEDULES.get(n_updates, [0]))} possible schedules, {len(seen)} seen)")
    if local:
        parts.append(f"{len(local)} replica-local statistics (a MirroredStrategy's: each replica moves its own copy, "
                     f"read as the copies' mean)")
    note = (f"legacy: {'; '.join(parts)}; modern: one update by the replicas' mean"
            + (f"; the two predictions differ by >= {min(gaps):.2g}" if gaps else ""))
    return judge(f"{sides.label}bn moving statistics{suffix}", sides.pair.name, errors, tol, expected=bool(gaps),
                 ok=ok, note=note)


def moving_floor(before: np.ndarray, stats: Sequence[np.ndarray], decay: float, tol: float) -> float:
    """The floor of a moving-statistic update (check_moving_statistics), in tensor_error's units."""
    return ((len(stats) + 1) * np.linalg.norm(np.spacing(np.abs(before)))
            + 4 * (1 - decay) * sum(np.linalg.norm(np.spacing(np.abs(s))) for s in stats)) / tol


def modern_moving(v: np.ndarray, a: Sequence[np.ndarray], decay: float, variant: causes.MovingVariant,
                  n: Optional[int], momentum: Optional[float] = None) -> np.ndarray:
    """The port's moving statistic after one step: v - (v - mean_i a_i)(1 - d), or as `variant` has it
    (its layer's own `momentum`; the biased variance, (n - 1) / n of the legacy towers' unbiased one, n the
    elements per channel of a tower, for a variance; replica 0's statistic alone)."""
    stats = [s * (n - 1) / n for s in a] if variant.biased and n else list(a)
    target = stats[0] if variant.replica_zero else np.mean(stats, axis=0)
    d = momentum if variant.momentum and momentum is not None else decay
    return v - (v - target) * (1 - d)


def elements_per_channel(sides: Sides) -> dict[str, int]:
    """For each moving variance: the elements per channel a tower's batch norm normalises over on a
    full batch (rows_per_tower x height x width, from the static shape of its input)."""
    out = {}
    for u in sides.legacy.moving:
        name = u.variable.op.name
        if "variance" not in name.rsplit("/", 1)[-1]:
            continue
        # The batch norm's input: the first float input of rank >= 2 of the op that computed the
        # statistic (a fused batch norm, or the cond around one).
        op = u.value.op
        while op.type in tf1_graph.PASS_THROUGH and op.inputs:
            op = op.inputs[0].op
        inputs = [t for t in op.inputs if t.dtype.is_floating and t.shape.rank and t.shape.rank >= 2]
        shape = inputs[0].shape if inputs else None
        if shape is not None and all(d is not None for d in shape[1:-1]):
            out[name] = sides.pair.rows_per_tower * int(np.prod(shape[1:-1]))
    return out


def explain_moving_statistics(sides: Sides, runs: list[RestartStep]) -> str:
    """The moving-statistics entries: the port's updates against `modern_moving` under each variant."""
    import keras
    legacy, tol = sides.legacy, sides.tol.model.rel_l2
    groups, decay = moving_groups(legacy), legacy.moving_decays()
    sizes = elements_per_channel(sides)

    def judge_variant(variant: causes.MovingVariant) -> tuple[bool, float, float]:
        worst = 0.0
        for r in runs:
            for name, ix in groups.items():
                v = np.asarray(r.before.weights[name], np.float64)
                a = [np.asarray(r.legacy.stats[i], np.float64) for i in ix]
                floor = moving_floor(r.before.weights[name], [r.legacy.stats[i] for i in ix], decay[name], tol)
                predicted = modern_moving(v, a, decay[name], variant, sizes.get(name), momenta.get(name))
                worst = max(worst, tensor_error("", r.modern_moving[name] - v, predicted - v, floor).rel_l2)
        return worst <= tol, worst, tol
    by_id = {id(v): n for n, v in sides.modern.names.items()}
    momenta = {by_id[id(v)]: float(layer.momentum) for layer in sides.modern.batch_norms
               if isinstance(layer, keras.layers.BatchNormalization)
               for v in (layer.moving_mean, layer.moving_variance) if id(v) in by_id}
    differ = [m for n, m in momenta.items() if n in decay and abs(m - decay[n]) > 1e-6]  # float32 decays
    return causes.explain_moving(judge_variant, differ, sides.towers)
