"""The checks again from a state where no variable sits at its initializer's special value.

From the common start every weight sits where its initializer put it: zero biases, unit gammas,
zero optimizer slots, shadows equal to their weights, step 0.  A term that vanishes there (a
regulariser on a variable that starts at zero, an update that multiplies a slot that starts at zero,
a warm-up or a schedule boundary not yet reached) is invisible from it, though it changes training
once the weights move.  `trained_state` moves everything: a few real training steps of the legacy
program (its slots, moving statistics and averages move), then every trainable weight moved by noise
of a tenth of its own scale (at least 0.05: a constant tensor, zero biases or unit gammas, moves too),
the step counter past every change of the learning rate and the moving averages' warm-up.  From it:
the training forward pass and gradients, restart steps, and, in a full run, free-running steps and the
moving averages.
"""
from __future__ import annotations

import numpy as np

from compare import tolerances
from compare.checks import averages, forward, free, steps
from compare.report import Result
from compare.settings import Settings
from compare.sides import Sides, State

SUFFIX = " (trained state)"


def trained_state(sides: Sides, train_steps: int = 3) -> State:
    legacy = sides.legacy
    legacy.restore(sides.start)
    for k in range(train_steps):
        batch = sides.batch(seed=500 + k)
        legacy.step(batch, tolerances.fixed_masks(sides, batch))
    state = legacy.state()
    rng = np.random.RandomState(sides.seed + 13)
    weights = dict(state.weights)
    for n in legacy.trainable:
        w = weights[n]
        scale = 0.1 * max(float(np.sqrt(np.mean(np.square(w, dtype=np.float64)))), 0.05)
        weights[n] = (w + rng.normal(0, scale, w.shape)).astype(np.float32)
    points = steps.change_points(legacy) or []
    warm = averages.past_warm_up(averages.decay_function(sides)[0]) if legacy.shadows else 0
    step = max([0] + [p + 2 for p in points] + [warm]) + 1000
    return state.replace(weights=weights, step=step)


def check_trained(sides: Sides, settings: Settings, free_steps: int) -> list[Result]:
    state = trained_state(sides)
    out = forward.check_training(sides, state=state, suffix=SUFFIX)
    count = 1 if settings.quick else 2
    out += steps.check_training_steps(sides, count, steps_at=[state.step + k for k in range(count)], start=state,
                                      suffix=SUFFIX)
    if not settings.quick and free_steps:
        out.append(free.check_free_running(sides, free_steps, start=state, suffix=SUFFIX))
        if sides.legacy.shadows:
            out += averages.check_moving_averages(sides, free_steps, start=state, suffix=SUFFIX)
    return out
