"""Results, error measures, tolerances and the report (table, JSON, plot) of the parity harness.

Every comparison is between two float tensors, `legacy` and `modern` (or a prediction of one from
the other), and is summarised by three numbers:

    max_abs = max |a - b|
    max_rel = max |a - b| / (|b| + tiny)          (tiny keeps exact zeros from dividing by zero)
    rel_l2  = ||a - b||_2 / max(||b||_2, tiny)

A check passes when, for every tensor it compares, rel_l2 <= its tolerance, and the worst tensor is
reported.  The tolerances below are multiples of float32's machine epsilon
(EPS32 = 2**-23 ~ 1.19e-7), one per kind of computation, with the reasoning next to each:
round-off in a sum of n float32 terms grows like sqrt(n) * EPS32 for random-signed errors, and
each layer of a network adds its own.
"""
import dataclasses
import json
import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)
TINY = 1e-30

# name -> (rel_l2 tolerance, why).  Printed with every report.
TOLERANCES = {
    "exact": (0.0, "bit-for-bit: a copy of the same float32 values (checkpoint round trip, lr schedule)"),
    "mlp": (64 * EPS32, "784-500-10 MLP: two matmuls of <= 784 terms, error ~ sqrt(784)*EPS32 = 28 EPS32, x2 margin"),
    "mlp_steps": (1024 * EPS32, "K SGD steps of the MLP: the per-step error above, compounded over K <= 16 steps"),
    "adam": (16 * EPS32, "one Adam update against its formula in float64 from the same slots: a few float32 "
                         "roundings of the update, plus one ulp of the stored weight (the floor)"),
    "chaos": (1.0, "free-running distance legacy-modern / (2 x legacy-perturbed-by-1-ulp), both relative to how far "
                   "the legacy weights moved: the modern program may not drift faster than round-off does "
                   "(measured worst ratio: see compare/README.md)"),
    "resnet": (2048 * EPS32, "ResNet-v2-50 forward/backward, 50+ layers each adding ~sqrt(fan_in <= 4608)*EPS32 "
                              "~ 68 EPS32, partly damped by batch norm: 2048 EPS32 ~ 2.4e-4"),
}


@dataclasses.dataclass
class TensorError:
    name: str
    max_abs: float
    max_rel: float
    rel_l2: float

    def as_dict(self):
        return dataclasses.asdict(self)


def tensor_error(name, a, b, floor=0.0):
    """Errors of `a` against the reference `b` (both array-like, same shape).

    floor: a norm below which `b` is not trusted as the yardstick of rel_l2 (rel_l2 = ||a - b|| /
    max(||b||, floor)).  Gradients use their even share of the whole gradient's norm (see
    `share_floors`): a tensor whose exact gradient is zero (the conv biases that feed a batch norm
    in training mode) holds only round-off on both sides, and its own norm says nothing.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"{name}: shapes differ, {a.shape} vs {b.shape}")
    if not a.size:
        return TensorError(name, 0.0, 0.0, 0.0)
    # In float64, in as few passes over memory as it takes (these run over 23.5M weights per check).
    with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf: NaN, caught below
        diff = np.subtract(a, b, out=np.empty(a.shape))  # float64 arrays, 0-d ones included
        np.abs(diff, out=diff)
        norm_diff = float(np.linalg.norm(diff))
    if not math.isfinite(norm_diff):
        # A NaN or Inf on either side is never agreement (NaN on both sides included: NaN - NaN and
        # Inf - Inf are NaN): a check that predicts a non-finite value tests for it itself (see
        # the split checks).
        return TensorError(name, math.inf, math.inf, math.inf)
    scale = np.abs(b, out=np.empty(b.shape))
    norm_b = float(np.linalg.norm(scale))
    scale += TINY
    max_abs = float(diff.max())
    max_rel = float(np.divide(diff, scale, out=diff).max())
    rel_l2 = norm_diff / max(norm_b, floor, TINY)
    return TensorError(name, max_abs, max_rel, rel_l2)


def share_floors(tensors):
    """{name: ||all tensors|| * sqrt(size / total size)}: each tensor's even share of the total norm."""
    total = float(np.sqrt(sum(np.sum(np.square(np.asarray(t, np.float64))) for t in tensors.values())))
    size = sum(np.size(t) for t in tensors.values())
    return {n: total * np.sqrt(np.size(t) / size) for n, t in tensors.items()}


@dataclasses.dataclass
class Result:
    """The outcome of one check.

    status: PASS, FAIL or EXPECTED (a known TF1/TF2 difference whose *prediction* held).
    errors: every tensor compared; the worst (by rel_l2 / tolerance) is reported.
    """
    check: str
    model: str
    status: str
    tolerance: str
    errors: list
    note: str = ""
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def worst(self):
        if not self.errors:
            return None
        return max(self.errors, key=lambda e: e.rel_l2)

    def as_dict(self):
        worst = self.worst
        return {
            "check": self.check, "model": self.model, "status": self.status,
            "tolerance": self.tolerance, "tolerance_rel_l2": TOLERANCES[self.tolerance][0],
            "worst": worst.as_dict() if worst else None, "note": self.note,
            "num_tensors": len(self.errors), "errors": [e.as_dict() for e in self.errors],
            "extra": self.extra,
        }


def judge(check, model, errors, tolerance, expected=False, note="", extra=None, ok=None):
    """Build a Result: PASS (or EXPECTED) when every error is within tolerance, else FAIL.

    `ok` overrides the tolerance test for checks whose pass condition is not an error bound
    (for example "the loss is NaN"); it must still be computed from measured values.
    """
    limit = TOLERANCES[tolerance][0]
    within = all(e.rel_l2 <= limit for e in errors) if ok is None else bool(ok)
    if not errors and ok is None:
        within = False  # a check that compared nothing proves nothing
    status = ("EXPECTED" if expected else "PASS") if within else "FAIL"
    return Result(check, model, status, tolerance, list(errors), note, dict(extra or {}))


# ---------------------------------------------------------------------------------------------
# Output

def format_table(results, seconds=None):
    """The stdout table: one line per check, then the tolerance table."""
    head = f"{'check':<44} {'model':<6} {'status':<9} {'worst tensor':<58} {'max_abs':>9} {'max_rel':>9} {'rel_l2':>9} {'tol':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        w = r.worst
        tol = TOLERANCES[r.tolerance][0]
        if w is None:
            lines.append(f"{r.check:<44} {r.model:<6} {r.status:<9} {'-':<58} {'':>9} {'':>9} {'':>9} {tol:>9.2e}")
        else:
            name = w.name if len(w.name) <= 58 else "..." + w.name[-55:]
            lines.append(f"{r.check:<44} {r.model:<6} {r.status:<9} {name:<58} {w.max_abs:>9.2e} "
                         f"{w.max_rel:>9.2e} {w.rel_l2:>9.2e} {tol:>9.2e}")
        if r.note:
            lines.append(f"{'':<44} {'':<6} {'':<9} note: {r.note}")
    lines.append("")
    lines.append("Tolerances (relative L2 error, float32 eps = %.3g):" % EPS32)
    for name, (tol, why) in TOLERANCES.items():
        lines.append(f"  {name:<13} {tol:9.2e}  {why}")
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "EXPECTED", "FAIL")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    if seconds is not None:
        summary += f"; run time {seconds:.1f} s"
    lines.append("")
    lines.append(summary)
    return "\n".join(lines)


def write_json(path, results, meta):
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [r.as_dict() for r in results],
                   "tolerances": {k: {"rel_l2": v[0], "why": v[1]} for k, v in TOLERANCES.items()}},
                  f, indent=2, default=float)


def read_json(path):
    """The results `write_json` wrote, as Result objects."""
    with open(path) as f:
        data = json.load(f)
    return [Result(d["check"], d["model"], d["status"], d["tolerance"],
                   [TensorError(**e) for e in d["errors"]], d["note"], d["extra"]) for d in data["results"]]


def write_plot(path, results):
    """Per-step loss (legacy vs modern) and per-variable gradient error by layer, log scale."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ModuleNotFoundError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                                  "(or the project's plot extra: pip install -e '.[plot]')", name="matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in results if "losses" in r.extra]
    grads = [r for r in results if r.check in ("gradients (read out of the train step)", "deviation: gradients of every step")]
    fig, axes = plt.subplots(2, max(1, len(steps), len(grads)), figsize=(12, 8), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for ax, r in zip(axes[0], steps):
        ax.set_visible(True)
        ax.plot(r.extra["losses"]["legacy"], "o-", label="legacy (TF1 towers)")
        ax.plot(r.extra["losses"]["modern"], "x--", label="modern (TF2 replicas)")
        ax.set_title(f"{r.model}: loss per step")
        ax.set_xlabel("step")
        ax.legend()
    for ax, r in zip(axes[1], grads):
        ax.set_visible(True)
        errs = [max(e.rel_l2, 1e-12) for e in r.errors]
        ax.semilogy(range(len(errs)), errs, ".")
        ax.axhline(TOLERANCES[r.tolerance][0], color="r", lw=0.8, label="tolerance")
        ax.set_title(f"{r.model}: gradient rel. L2 error per variable\n(input -> output; exact 0 drawn at 1e-12)",
                     fontsize=10)
        ax.set_xlabel("variable index")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
