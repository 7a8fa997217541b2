"""The priors of ``dynamic``'s estimator and control loop: every number it assumes before it measures,
and every margin of its decisions, in one documented object (after adaptdl's ``goodput.py`` habit).

Each field says what quantity it stands for and why that value. The ASP controller's are
:class:`omnilearn.control.asp.AsyncPriors`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Priors:
    """What ``dynamic`` assumes (see the module)."""

    # ---- the fixed cost k (control/fixed_cost.py)
    dof: float = 4.0
    """Degrees of freedom of the Student-t measurement noise (heavy tails: CFS-period jumps), of a step's
    time and of every piece of evidence on k."""
    k_points: int = 97
    """Points of k's grid over ``[0, k_max_factor * B / n]``: a sixth of an equal share apart at the
    default reach, finer than a fit of a few noisy steps tells k."""
    k_prior: float = 0.25
    """k's prior: exponential, its mean this share of a worker's equal share B/n: small until measured
    (a fixed cost large against the batch shows in the probe or the first re-split)."""
    k_max_factor: float = 16.0
    """k's grid reaches this many equal shares B/n: a fixed cost beyond it is 'time does not follow the batch'."""
    # ---- changes of speed (control/changes.py)
    event_share: float = 0.5
    """The chance that a worker's speed, relative to the others', moved when the cluster changed: a level
    change moves every allocation, and about half the workers' shares of the job move with them."""
    # ---- the speeds and their noise (control/model.py)
    noise: float = 0.05
    """Measurement noise (sd of a log time) assumed until a worker's own innovations have measured it."""
    noise_floor: float = 0.005
    """The smallest measurement noise believed: timers and schedulers are never exact."""
    noise_dof: int = 2
    """Degrees of freedom the prior noise is worth (a speed's posterior is Student-t with the noise's
    measured steps plus these): an unmeasured noise makes every gain uncertain."""
    noise_memory: int = 32
    """Steps of each worker's innovations behind its measurement noise."""
    pair_scale: float = 2.5813
    """A normal noise's sd over the median of its :meth:`~omnilearn.control.noise.NoiseScale.learn` samples (the lesser of a
    step's two differences, over sqrt 2)."""
    noise_weight: float = 4.0
    """The prior noise counts as this many steps of evidence."""
    jump: float = 1.0
    """The sd (in log) of a speed jump: a level change moves a speed by a factor of 1.5-8."""
    start_var: float = 4.0
    """The variance of a speed nobody has measured (log scale): anything from 1/7 to 7 times the others."""
    shift_steps: int = 6
    """Recent innovations a worker's shift test looks back over."""
    probe_shape: float = 0.1
    """The sd (log) of the probe's time ratio between its two sizes about the line ``c (b + k)`` the job's
    sizes follow: at B/(8n) and B/(4n) a core is used less well than at a worker's share, and the ratio
    reads low (k high). A ResNet18 step alone on one thread: log t16/t8 = 0.34, where the line through 16-187
    samples (k = 3.5) gives 0.53; on two, 0.22 against 0.32 (k = 13). The smaller of the two misfits: the
    first re-split tells k at the job's sizes (``results/2026-11-28_2cpu_probe-k.md``)."""
    scale_weight: float = 0.3
    """The weight of a step's common factor in the running scale that turns relative predictions into
    seconds (an exponential average over about three steps: one slow host step moves it a third)."""
    reweight_passes: int = 3
    """Student-t reweighting passes behind a step's common factor, from the median: three move it within
    a small share of the noise of its fixed point on four to a thousand workers."""
    jump_belief: float = 0.5
    """The posterior probability of a jump at which a worker's speed is taken as changed (its estimate
    reopened): the likelier of the two hypotheses."""
    # ---- decisions (control/dynamic.py)
    trust: float = 16.0
    """A new batch stays within [lowest measured / trust, highest measured * trust] of that worker: from
    the probe's larger size (B/(4n)) four times the equal share at once."""
    draws: int = 64
    """Posterior draws behind a decision's expected gain and its spread."""
    cost_prior: float = 0.1
    """The cost of a re-split, as a share of the predicted step, before it is measured."""
    cost_prior_weight: int = 2
    """The prior cost counts as this many measurements: a re-split's cost is a difference of two steps, and
    one step the host slowed (a third of a step, on a shared host) would otherwise set C alone."""
    watch_steps: int = 2
    """Steps measured whatever the budget after a speed changed: the new speed's next evidence."""
    resplit_costs_kept: int = 8
    """Measured re-split costs kept (C is the median of them and the prior's)."""
    strides: tuple[float, ...] = (1.0, 0.5, 0.25)
    """The moves a decision weighs, in turn: the whole way to the balanced split, half of it, a quarter.
    Each is judged by the rule on the same posterior draws, and the first that passes is taken. Where the
    estimate is sure of the direction but not of how far (a few steps of a noisy loop), the whole move
    overshoots in many draws and fails, and a part of it may be sure; the next decision goes on from
    where it lands. A whole move that passes is always taken whole."""
    # ---- the control loop's measurements (control/loop.py)
    min_rate: float = 0.01
    """The least CPU rate a probe is taken at (CPU seconds per second; a slower pass is not believed further)."""
    budget: float = 0.02
    """The share of the job's time the controller may spend measuring and deciding. Each rank's controller
    costs it CPU (about half a millisecond a step for a few workers), and on a rank under a CPU quota that
    CPU is wall time at the quota's rate: on a 0.17-CPU rank whose steps last 25 ms it is a fifth of every
    step. A controller that may leave steps out (``skips_steps``) measures a step only once the steps since
    the last one it measured took ``cost / budget`` (``cost``: the largest rank's, shared by the
    all-reduce): steps of seconds are all measured, steps of milliseconds every few, and a decision point
    in between waits for the next step measured. The first two steps at a new split are always measured,
    and so is every step while a move held for want of evidence would save more a step than a measurement
    costs (the controller's ``at_stake``): there the evidence is worth its price. A measurement's cost is
    the median of the last :attr:`measurement_costs_kept` read: one reading inflated by a pause of the rank's process (a
    garbage collection, a preemption) would otherwise stop the measurements that would replace it."""
    measurement_costs_kept: int = 5
    """The controller's costs of the last steps measured behind its cost of a measurement (their median)."""
    min_pass_s: float = 0.1
    """Under a CPU quota the start-up pass lasts at least this long (wall seconds; more rounds where steps
    are short): its CPU rate is read over ten of the emulator's CFS periods (``emulation.cpu_period_us``,
    10 ms) and a kernel default one (100 ms), not inside one, where a single wait for the quota or a
    single preemption would set it (a 10-ms pass preempted once for 10 ms reads half its rate, for 50 ms a
    sixth). Its cost is set-up, paid once. Without a quota a round's wall time is its cost and needs no
    rate (an interruption only adds time, and the least of two leaves it out): the pass keeps its
    rounds."""
    max_rounds: int = 256
    """The most rounds a size gets in the start-up pass, however short its steps."""


PRIORS = Priors()
"""The priors every ``dynamic`` controller runs with."""
