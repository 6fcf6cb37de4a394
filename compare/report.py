"""Results, error measures, tolerances and the report (table, JSON, plot) of the parity harness.

Every comparison is between two float tensors, `legacy` and `modern` (or a prediction of one from
the other), and is summarised by three numbers:

    max_abs = max |a - b|
    max_rel = max |a - b| / (|b| + tiny)          (tiny keeps exact zeros from dividing by zero)
    rel_l2  = ||a - b||_2 / max(||b||_2, tiny)

A check passes when, for every tensor it compares, rel_l2 <= its tolerance, and the worst tensor is
reported.  Tolerances are multiples of float32's machine epsilon (EPS32 = 2**-23 ~ 1.19e-7): the
few that hold for every model are below (STATIC); those that depend on the model are derived for each
pair from its graph and from floors measured in the same run (`compare.tolerances`), and every report
prints how each was derived.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
TINY = 1e-30
STATUSES = ("PASS", "EXPECTED", "NOT APPLICABLE", "FAIL", "ERROR")
FAILING = ("FAIL", "ERROR")  # the statuses that make the run's exit status nonzero


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """A relative-L2 tolerance, its name, and how it was derived (printed with every report).

    The ones a pair's checks use are derived from its model and from floors measured in the same
    run (`compare.tolerances`); the few below are the same for every pair."""
    name: str
    rel_l2: float
    derivation: str


# The tolerances that do not depend on the model (a pair's derived ones: compare.tolerances).
STATIC = {t.name: t for t in (
    Tolerance("exact", 0.0, "bit for bit: a copy of the same float32 values (checkpoints, pipelines, counters)"),
    Tolerance("optimizer", 16 * EPS32, "one optimizer update against its formula in float64 from the same "
                                       "slots: a few float32 roundings of the update (16 eps32), with floors of "
                                       "one ulp of the stored weight and the ulps of the slots a gradient is "
                                       "read back from"),
    Tolerance("schedule", 4 * EPS32, "a learning-rate schedule in float32: a pow, a division and a product "
                                     "round to within a few ulps (4 eps32)"),
    Tolerance("chaos", 1.0, "free-running distance legacy-modern over FACTOR x the distance between the legacy "
                            "program and itself started 1 ulp away (the system's own sensitivity, measured in "
                            "this run): the port may not drift faster than round-off does"),
    Tolerance("mlp_steps", 1024 * EPS32, "K SGD steps of the 784-500-10 MLP (compare/multiworker.py): "
                                         "per-step round-off ~sqrt(784) eps32, compounded over K <= 16 steps"),
)}
# The static tolerances by name: {name: (rel_l2, derivation)}.
TOLERANCES = {t.name: (t.rel_l2, t.derivation) for t in STATIC.values()}


MARGIN = 16  # how far above the measured round-off floors a correct port may land


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """The tolerances of one built pairing, each with its derivation (compare.tolerances derives them).

    model: forward passes, gradients, splits, one training step, moving statistics, evaluation;
    steps: K free-running steps of a model that is not chaotic; optimizer, schedule: the static ones
    (STATIC); spread: per gradient, the norm of the legacy program's repeat spread (a floor of that
    tensor's comparison); tensors: per-tensor tolerances by name, where a tensor has its own (`of(name)`
    falls back on the model tolerance)."""
    model: Tolerance
    steps: Tolerance
    optimizer: Tolerance = STATIC["optimizer"]
    schedule: Tolerance = STATIC["schedule"]
    spread: Mapping[str, float] = dataclasses.field(default_factory=dict)
    tensors: Mapping[str, Tolerance] = dataclasses.field(default_factory=dict)

    def of(self, name: str) -> Tolerance:
        return self.tensors.get(name, self.model)


def tolerance_of(tolerance: Union[Tolerance, str]) -> Tolerance:
    """A Tolerance, from itself or from a STATIC name."""
    return tolerance if isinstance(tolerance, Tolerance) else STATIC[tolerance]


@dataclasses.dataclass
class TensorError:
    """One compared tensor's errors; `tolerance`: its own relative-L2 tolerance, where it has one
    (Tolerances.tensors), else the check's."""
    name: str
    max_abs: float
    max_rel: float
    rel_l2: float
    tolerance: Optional[float] = None
    # What it is about, set where it is made (the step localisation reads these, never the name):
    step: Optional[int] = None       # the global step it was compared at, where a step's
    variable: Optional[str] = None   # the TF1 variable it is of (its gradient, update or slot), where one
    slot: Optional[str] = None       # the optimizer slot it is of (TF1's key), where one
    probe: bool = False              # compared at a probed step, without training (a schedule read)

    def limit(self, check: float) -> float:
        return check if self.tolerance is None else self.tolerance

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tensor_error(name: str, a: Any, b: Any, floor: float = 0.0, step: Optional[int] = None,
                 variable: Optional[str] = None, slot: Optional[str] = None, probe: bool = False) -> TensorError:
    """Errors of `a` against the reference `b` (both array-like, same shape); `step`, `variable`,
    `slot` and `probe` say what it is about (fields: nothing reads them back out of the name).

    floor: a norm below which `b` is not trusted as the yardstick of rel_l2 (rel_l2 = ||a - b|| /
    max(||b||, floor)).  Gradients use their even share of the whole gradient's norm (see
    `share_floors`): a tensor whose exact gradient is zero (the conv biases that feed a batch norm
    in training mode) holds only round-off on both sides, and its own norm says nothing.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"{name}: shapes differ, {a.shape} vs {b.shape}")
    return errors_of(name, Sums.over(a, b), floor, step=step, variable=variable, slot=slot, probe=probe)


def errors_of(name: str, sums: "Sums", floor: float, **about: Any) -> TensorError:
    """The TensorError of what `Sums.over` gathered, rel_l2 against max(||b||, floor)."""
    norm_diff = math.sqrt(sums.diff2)
    if not math.isfinite(norm_diff):
        # A NaN or Inf on either side is never agreement (NaN on both sides included: NaN - NaN and
        # Inf - Inf are NaN): a check that predicts a non-finite value tests for it itself (see
        # the split checks).
        return TensorError(name, math.inf, math.inf, math.inf, **about)
    rel_l2 = norm_diff / max(math.sqrt(sums.ref2), floor, TINY)
    return TensorError(name, sums.max_abs, sums.max_rel, rel_l2, **about)


BLOCK = 1 << 16  # elements per block: a few float64 blocks stay in a core's cache


@dataclasses.dataclass
class Sums:
    """What the errors of `a` against `b` are made of, gathered in float64 over blocks of BLOCK
    elements (one pass over memory, where whole-array numpy would take a dozen: these run over the
    23.5M weights of ResNet-v2-50 per check): the sums of squares of a - b and of b, the largest
    |a - b| and |a - b| / (|b| + TINY); where asked, the sums of squares of one float32 ulp of
    `offset` and of `b` as given (`spacing2`, `ref_spacing2`)."""
    diff2: float = 0.0
    ref2: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    spacing2: float = 0.0
    ref_spacing2: float = 0.0

    def add(self, other: "Sums") -> "Sums":
        """These sums and `other`'s (of the elements of both)."""
        return Sums(self.diff2 + other.diff2, self.ref2 + other.ref2, max(self.max_abs, other.max_abs),
                    max(self.max_rel, other.max_rel), self.spacing2 + other.spacing2,
                    self.ref_spacing2 + other.ref_spacing2)

    @classmethod
    def over(cls, a: np.ndarray, b: np.ndarray, offset: Optional[np.ndarray] = None,
             spacings: bool = False) -> "Sums":
        """The sums of `a - offset` against `b - offset` (of `a` against `b` without an offset)."""
        if a.shape != b.shape:
            raise ValueError(f"shapes differ, {a.shape} vs {b.shape}")
        if spacings and offset is None:
            raise ValueError("spacings are those of the offset and of b: give the offset")
        sums = cls()
        a, b = a.reshape(-1), b.reshape(-1)
        o = None if offset is None else np.asarray(offset).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf: NaN, caught in errors_of
            for i in range(0, a.size, BLOCK):
                x = a[i:i + BLOCK].astype(np.float64)
                y = b[i:i + BLOCK].astype(np.float64)
                if spacings and o is not None:
                    sums.spacing2 += squares(ulps(o[i:i + BLOCK]))
                    sums.ref_spacing2 += squares(ulps(b[i:i + BLOCK]))
                if o is not None:
                    z = o[i:i + BLOCK].astype(np.float64)
                    x -= z
                    y -= z
                x -= y
                np.abs(x, out=x)
                np.abs(y, out=y)
                sums.diff2 += squares(x)
                sums.ref2 += squares(y)
                sums.max_abs = max(sums.max_abs, float(x.max()))
                y += TINY
                sums.max_rel = max(sums.max_rel, float(np.divide(x, y, out=x).max()))
        return sums


def ulps(values: np.ndarray) -> np.ndarray:
    """One float32 ulp of each value, in float64."""
    return np.spacing(np.abs(np.asarray(values, np.float32))).astype(np.float64)


def squares(x: np.ndarray) -> float:
    return float(np.dot(x, x))


def share_floors(tensors: Mapping[str, Any]) -> dict[str, float]:
    """{name: ||all tensors|| * sqrt(size / total size)}: each tensor's even share of the total norm."""
    total = float(np.sqrt(sum(np.sum(np.square(np.asarray(t, np.float64))) for t in tensors.values())))
    size = sum(np.size(t) for t in tensors.values())
    return {n: total * np.sqrt(np.size(t) / size) for n, t in tensors.items()}


@dataclasses.dataclass
class Part:
    """One place a FAIL was localised over (a layer, a layer's gradients, a step's variable group):
    its error against its own tolerance; `inherited`: the error it shows as the port computes it from
    its own inputs (the isolated `error` is from the reference's inputs), where measured."""
    name: str
    error: float
    tolerance: float
    inherited: Optional[float] = None
    note: str = ""
    step: Optional[int] = None  # the global step it is of, where a step's

    @property
    def parts(self) -> bool:
        """Whether the two sides part here (beyond the tolerance; a NaN or a shape mismatch is inf)."""
        return not self.error <= self.tolerance


@dataclasses.dataclass
class Diagnosis:
    """Where a FAIL first parts and why (compare.diagnosis, compare.causes): `where` and `cause` are
    the report's lines under the FAIL, `parts` every place compared, in the order searched."""
    where: str
    cause: str = ""
    parts: list[Part] = dataclasses.field(default_factory=list)
    kind: str = ""      # what was localised: "layers", "gradients by layer", "steps"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Diagnosis":
        return Diagnosis(d["where"], d.get("cause", ""), [Part(**p) for p in d.get("parts", ())], d.get("kind", ""))


@dataclasses.dataclass
class Result:
    """The outcome of one check.

    status: PASS, FAIL, EXPECTED (a known TF1/TF2 difference whose *prediction* held) or
      NOT APPLICABLE (the pair does not have what the check judges; the note says why).
    errors: every tensor compared; the worst (by rel_l2 / tolerance) is reported.
    tolerance: the Tolerance the errors were judged against.
    """
    check: str
    model: str
    status: str
    tolerance: Tolerance
    errors: list
    note: str = ""
    extra: dict = dataclasses.field(default_factory=dict)
    diagnosis: Optional[Diagnosis] = None

    @property
    def worst(self) -> Optional[TensorError]:
        """The tensor furthest out of (or least within) its own tolerance."""
        if not self.errors:
            return None
        check = self.tolerance.rel_l2

        def out(e: TensorError) -> float:  # how far out of its tolerance (an exact one: by the error itself)
            limit = e.limit(check)
            return e.rel_l2 / limit if limit > 0 else e.rel_l2
        return max(self.errors, key=out)

    @property
    def catches(self) -> Optional[float]:
        """The smallest relative change (L2) of a compared tensor that this check is sure to FAIL: the
        largest tolerance any of its tensors is held to (None where it judged nothing)."""
        if self.status in ("NOT APPLICABLE", "ERROR"):
            return None
        check = self.tolerance.rel_l2
        return max((e.limit(check) for e in self.errors), default=check)

    def as_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "check": self.check, "model": self.model, "status": self.status,
            "tolerance": self.tolerance.name, "tolerance_rel_l2": self.tolerance.rel_l2,
            "tolerance_derivation": self.tolerance.derivation,
            "worst": worst.as_dict() if worst else None, "note": self.note,
            "num_tensors": len(self.errors), "catches": self.catches, "errors": [e.as_dict() for e in self.errors],
            "extra": self.extra,
            "diagnosis": self.diagnosis.as_dict() if self.diagnosis else None,
        }


def judge(check: str, model: str, errors: Sequence[TensorError], tolerance: Union[Tolerance, str],
          expected: bool = False, note: str = "", extra: Optional[Mapping[str, Any]] = None,
          ok: Optional[bool] = None) -> Result:
    """Build a Result: PASS (or EXPECTED) when every error is within tolerance, else FAIL.

    tolerance: a Tolerance or the name of a STATIC one.  `ok` overrides the tolerance test for
    checks whose pass condition is not an error bound (for example "the loss is NaN"); it must still
    be computed from measured values.
    """
    tolerance = tolerance_of(tolerance)
    within = all(e.rel_l2 <= e.limit(tolerance.rel_l2) for e in errors) if ok is None else bool(ok)
    if not errors and ok is None:
        within = False  # a check that compared nothing proves nothing
    status = ("EXPECTED" if expected else "PASS") if within else "FAIL"
    return Result(check, model, status, tolerance, list(errors), note, dict(extra or {}))


def not_applicable(check: str, model: str, reason: str) -> Result:
    """A check the pair gives nothing to judge with: never a PASS."""
    return Result(check, model, "NOT APPLICABLE", STATIC["exact"], [], reason)


def error_result(check: str, model: str, error: BaseException, where: str = "") -> Result:
    """A check that raised: its exception (type and first line) and where it came from."""
    message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    note = f"{type(error).__name__}" + (f": {message}" if message else "") + (f" (raised in {where})" if where else "")
    return Result(check, model, "ERROR", STATIC["exact"], [], note)


# ---------------------------------------------------------------------------------------------
# Output

def format_table(results: Sequence[Result], seconds: Optional[float] = None) -> str:
    """The stdout table: one line per check, then the tolerances the checks used, with their derivations."""
    head = (f"{'check':<46} {'model':<8} {'status':<9} {'worst tensor':<56} {'max_abs':>9} {'max_rel':>9} "
            f"{'rel_l2':>9} {'tol':>9} {'catches':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        w = r.worst
        tol = r.tolerance.rel_l2
        status = "N/A" if r.status == "NOT APPLICABLE" else r.status
        catches = f" {r.catches:>9.2e}" if r.catches is not None else ""
        if w is None:
            lines.append(f"{r.check:<46} {r.model:<8} {status:<9} {'-':<56} {'':>9} {'':>9} {'':>9} "
                         + (f"{tol:>9.2e}{catches}" if r.status not in ("NOT APPLICABLE", "ERROR") else ""))
        else:
            name = w.name if len(w.name) <= 56 else "..." + w.name[-53:]
            lines.append(f"{r.check:<46} {r.model:<8} {status:<9} {name:<56} {w.max_abs:>9.2e} "
                         f"{w.max_rel:>9.2e} {w.rel_l2:>9.2e} {w.limit(tol):>9.2e}{catches}")
        if r.note:
            lead = {"NOT APPLICABLE": "why: ", "ERROR": "error: "}.get(r.status, "note: ")
            lines.append(f"{'':<46} {'':<8} {'':<9} {lead}{r.note}")
        if r.diagnosis is not None:
            lines.append(f"{'':<46} {'':<8} {'':<9} where: {r.diagnosis.where}")
            if r.diagnosis.cause:
                lines.append(f"{'':<46} {'':<8} {'':<9} cause: {r.diagnosis.cause}")
    lines.append("")
    lines.append("Tolerances (relative L2 error, float32 eps = %.3g), as each check derived them:" % EPS32)
    seen: dict[tuple[str, str, float], Tolerance] = {}
    for r in results:
        if r.status not in ("NOT APPLICABLE", "ERROR"):
            seen.setdefault((r.model, r.tolerance.name, r.tolerance.rel_l2), r.tolerance)
    for (model, name, value), t in sorted(seen.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        lines.append(f"  {model:<8} {name:<12} {value:9.2e}  {t.derivation}")
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s not in ("NOT APPLICABLE", "ERROR"))
    if seconds is not None:
        summary += f"; run time {seconds:.1f} s"
    lines.append("")
    lines.append(summary)
    return "\n".join(lines)


def profile_table(marks: Sequence[tuple[float, str]], end: float) -> list[str]:
    """Where a run's time went: each progress line's phase lasts until the next line (the last one
    until `end`), slowest first, with its share of the run; the time before the first line is the
    start-up (imports, adapters, data files)."""
    starts = [(0.0, "start-up: imports, adapters, data files"), *marks]
    phases = [(starts[i + 1][0] - t if i + 1 < len(starts) else end - t, what) for i, (t, what) in enumerate(starts)]
    lines = [f"Where the time went ({end:.1f} s in this process, slowest phase first):"]
    lines += [f"  {seconds:7.1f} s  {100 * seconds / max(end, 1e-9):5.1f}%  {what[:110]}"
              for seconds, what in sorted(phases, key=lambda p: -p[0])]
    return lines


def write_json(path: str, results: Sequence[Result], meta: Mapping[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [r.as_dict() for r in results]}, f, indent=2, default=float)


def read_json(path: str) -> list[Result]:
    """The results `write_json` wrote, as Result objects."""
    with open(path) as f:
        data = json.load(f)
    return [Result(d["check"], d["model"], d["status"],
                   Tolerance(d["tolerance"], d["tolerance_rel_l2"], d.get("tolerance_derivation", "")),
                   [TensorError(**e) for e in d["errors"]], d["note"], d["extra"],
                   Diagnosis.from_dict(d["diagnosis"]) if d.get("diagnosis") else None) for d in data["results"]]


def write_plot(path: str, results: Sequence[Result]) -> None:
    """Per-step loss (legacy vs modern) and per-variable gradient error by layer, log scale."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ModuleNotFoundError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                                  "(or the project's plot extra: pip install -e '.[plot]')",
                                  name="matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[list[Result], Callable[[Any, Result], None]]] = [
        ([r for r in results if "losses" in r.extra], plot_losses),
        ([r for r in results if r.extra.get("plot") == "gradients"], plot_gradients),
        ([r for r in results if r.diagnosis is not None and r.diagnosis.parts][:4], plot_parts)]
    panels = [(rs, draw) for rs, draw in panels if rs]  # a row a kind, only the kinds this run has
    rows = max(1, len(panels))
    fig, axes = plt.subplots(rows, max([1] + [len(rs) for rs, _ in panels]), figsize=(12, 4 * rows),
                             squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for row, (rs, draw) in zip(axes, panels):
        for ax, r in zip(row, rs):
            ax.set_visible(True)
            draw(ax, r)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_losses(ax: Any, result: Result) -> None:
    ax.plot(result.extra["losses"]["legacy"], "o-", label="legacy (TF1 towers)")
    ax.plot(result.extra["losses"]["modern"], "x--", label="modern (TF2 replicas)")
    ax.set_title(f"{result.model}: loss per step")
    ax.set_xlabel("step")
    ax.legend()


def plot_gradients(ax: Any, result: Result) -> None:
    errs = [max(e.rel_l2, 1e-12) for e in result.errors]
    ax.semilogy(range(len(errs)), errs, ".")
    ax.axhline(result.tolerance.rel_l2, color="r", lw=0.8, label="tolerance")
    ax.set_title(f"{result.model}: gradient rel. L2 error per variable\n(input -> output; exact 0 drawn at 1e-12)",
                 fontsize=10)
    ax.set_xlabel("variable index")
    ax.legend()


def plot_parts(ax: Any, result: Result) -> None:
    """One localised FAIL: each place's error against its own tolerance (log scale), in the order
    searched, the first place beyond it in red; a shape mismatch or NaN drawn at the top."""
    assert result.diagnosis is not None
    parts = [p for p in result.diagnosis.parts if not math.isnan(p.tolerance)]
    finite = [p.error for p in parts if math.isfinite(p.error) and p.error > 0] or [1.0]
    top = max(finite + [p.tolerance for p in parts]) * 10
    errs = [min(max(p.error, 1e-12), top) if not math.isnan(p.error) else top for p in parts]
    x = range(len(parts))
    ax.semilogy(x, errs, ".-", color="C0", label="error (isolated)")
    inherited = [p.inherited for p in parts]
    if any(v is not None for v in inherited):
        ax.semilogy(x, [min(max(v, 1e-12), top) if v is not None and not math.isnan(v) else math.nan
                        for v in inherited], ":", color="C2", label="as the port computes it")
    ax.step(x, [max(p.tolerance, 1e-12) for p in parts], where="mid", color="r", lw=0.8, label="tolerance")
    first = next((i for i, p in enumerate(parts) if p.parts), None)
    if first is not None:
        ax.semilogy([first], [errs[first]], "o", color="r", ms=8, label=f"parts first: {parts[first].name[:30]}")
    ax.set_xticks(list(x))
    ax.set_xticklabels([p.name.split(" (")[0][:24] for p in parts], rotation=90, fontsize=6)
    ax.set_title(f"{result.model}: {result.check[:50]}\n{result.diagnosis.kind}, where it parts", fontsize=9)
    ax.legend(fontsize=7)
