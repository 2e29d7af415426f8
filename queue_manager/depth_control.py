"""Online queue depths: refit the paper's latency line from live answers and follow its SLO crossing.

WindVE sets each pool's depth once, from a profiling run. A pool's speed drifts (thermal throttling,
a noisy neighbour, a heavier length mix): the calibrated depth is then too deep (the tail misses the
SLO) or too shallow (BUSY answers the pool could have served). Per pool this module keeps

- a decayed window of samples (C, t): the pool's in-flight queries when a request was admitted and
  the seconds its caller reported, refitted as t = alpha*C + beta under the calibration's
  constraint alpha, beta >= 0 (weighted non-negative least squares; estimator.fit's has no weights,
  and two coefficients have a closed form); its SLO crossing is C* = (SLO - beta) / alpha * (1 - headroom);
- the recent tail: p99 of the answers of requests admitted since the depth last moved, so that a
  step judges the depth in force, not the one before it. Requests still unanswered an SLO after
  their admission count in it too, at their age so far: they will miss the SLO whatever they end
  at, and without them a tail judged soon after a move sees only the fast answers (the slow ones
  are still running), and the depth rose again under a tail over the SLO.

The target is the smaller of C* and the tail's own estimate (the level at which the tail, taken as
proportional to C, would sit at SLO x (1 - headroom)). A step lowers the depth at once when the tail
misses the SLO (to the target, at most halving per step); drifts it down toward the target, at most
`up_step` per step, while the tail is inside the SLO but not its headroom; raises it toward the target,
at most `up_step` per step, while the tail of the requests admitted at least an SLO ago is inside the
headroom at 95 % confidence (an upper bound on their true p99, which needs 299 answers or more) and
those of them admitted since the pool was full say so too (elsewhere a deeper queue changes
nothing and shows nothing). It stays
within [1, seed x cap], the seed being the calibrated or probed depth.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

# The calibration's (estimator.fit.DEFAULT_HEADROOM, which a test holds this to): not imported, as
# estimator.fit brings scikit-learn into the dispatcher for a two-coefficient fit.
DEFAULT_HEADROOM = 0.15
MIN_BIN_WEIGHT = 1e-3  # a concurrency level's decayed weight below this is forgotten
RECENT_SAMPLES = 4096
# A rise needs the tail's upper bound at this confidence inside the headroom (p99_upper_bound).
RISE_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Line:
    """t = alpha*C + beta (seconds), fitted on `levels` concurrency levels of `weight` decayed samples."""

    alpha: float
    beta: float
    levels: int
    weight: float

    def predict(self, concurrency: float) -> float:
        return self.alpha * concurrency + self.beta


def fit_nonnegative(levels: list[float], means: list[float], weights: list[float]) -> Line | None:
    """Weighted least squares t = alpha*C + beta with alpha, beta >= 0; None with fewer than two levels.

    The problem is convex: when the unconstrained optimum breaks a constraint the constrained one lies
    on a boundary, alpha = 0 (beta = weighted mean) or beta = 0 (a line through the origin); of those
    the one with the smaller weighted error.
    """
    w = sum(weights)
    sc = sum(wi * c for wi, c in zip(weights, levels))
    st = sum(wi * t for wi, t in zip(weights, means))
    scc = sum(wi * c * c for wi, c in zip(weights, levels))
    sct = sum(wi * c * t for wi, c, t in zip(weights, levels, means))
    determinant = w * scc - sc * sc
    if len(levels) < 2 or determinant <= 1e-12 * w * scc:
        return None
    alpha = (w * sct - sc * st) / determinant
    beta = (st - alpha * sc) / w
    if alpha < 0 or beta < 0:

        def error(a: float, b: float) -> float:
            return sum(wi * (t - a * c - b) ** 2 for wi, c, t in zip(weights, levels, means))

        flat, through_origin = (0.0, st / w), (sct / scc, 0.0)
        alpha, beta = min(flat, through_origin, key=lambda line: error(*line))
    return Line(alpha=max(0.0, alpha), beta=max(0.0, beta), levels=len(levels), weight=w)


@dataclass(frozen=True)
class ControlSettings:
    slo: float  # seconds
    headroom: float = DEFAULT_HEADROOM
    cap: float = 2.0  # the depth stays <= seed x cap
    half_life: float = 10.0  # seconds for a sample's weight in the fit to halve
    tail_window: float = 5.0  # seconds of answers the tail looks back over
    min_samples: int = 20  # answers at the depth in force before a step judges it
    up_step: float = 0.10  # largest relative rise per step
    # No move for a target this close, relative to the depth (at least one query): a step's noise.
    # Wider above than below: a depth too deep costs the SLO, one too shallow only some BUSY answers.
    band_below: float = 0.05
    band_above: float = 0.10
    max_cut: float = 0.5  # largest relative fall per step

    def __post_init__(self) -> None:
        if not (self.slo > 0 and math.isfinite(self.slo)):
            raise ValueError(f"the SLO must be a positive number of seconds, got {self.slo!r}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom must be a fraction in [0, 1), got {self.headroom!r}")
        if self.cap < 1:
            raise ValueError(f"the depth cap must be >= 1, got {self.cap!r}")


class DecayedLine:
    """Samples (C, t) with exponentially decaying weights, kept as sums per concurrency level.

    Weighted least squares over per-level means weighted by the levels' summed weights has the same
    solution as over the raw samples, so memory is bounded by the depth, not by the traffic. Decay
    scales every weight alike, which leaves the solution unchanged: only new samples call for a refit.
    """

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._weight: dict[int, float] = {}
        self._weighted_seconds: dict[int, float] = {}
        self._fresh = False
        self._fit: Line | None = None

    def add(self, concurrency: int, seconds: float) -> None:
        self._weight[concurrency] = self._weight.get(concurrency, 0.0) + 1.0
        self._weighted_seconds[concurrency] = self._weighted_seconds.get(concurrency, 0.0) + seconds
        self._fresh = True

    def decay(self, elapsed: float) -> None:
        if elapsed <= 0:
            return
        factor = 0.5 ** (elapsed / self.half_life)
        for level in list(self._weight):
            weight = self._weight[level] * factor
            if weight < MIN_BIN_WEIGHT:
                del self._weight[level], self._weighted_seconds[level]
                self._fresh = True
            else:
                self._weight[level] = weight
                self._weighted_seconds[level] *= factor

    @property
    def weight(self) -> float:
        """The samples' decayed count."""
        return sum(self._weight.values())

    def fit(self) -> Line | None:
        """The current line, or None while the samples span fewer than two concurrency levels."""
        if self._fresh:
            self._fresh = False
            levels = sorted(self._weight)
            weights = [self._weight[c] for c in levels]
            means = [self._weighted_seconds[c] / self._weight[c] for c in levels]
            self._fit = fit_nonnegative(levels, means, weights)
        return self._fit


@dataclass(frozen=True)
class Sample:
    admitted: float
    answered: float
    concurrency: int
    seconds: float


# Why a depth last moved, as /metrics labels it (a bounded set; /info's `reason` has the figures).
SEEDED = "seed"  # a calibration, the warm-up probe or the start set it
OVER_SLO = "over_slo"  # the tail missed the SLO: cut
NEAR_SLO = "near_slo"  # the tail inside the SLO but not its headroom: drifted down
ROOM = "room"  # the tail inside the headroom at 95 % confidence: raised
CAUSES = (SEEDED, OVER_SLO, NEAR_SLO, ROOM)


@dataclass(frozen=True)
class Move:
    depth: int
    direction: str  # "up" or "down"
    reason: str
    cause: str  # one of CAUSES but SEEDED


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile: an observed value, with no interpolation to argue about."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def p99_upper_bound(values: list[float], confidence: float = RISE_CONFIDENCE) -> float | None:
    """An upper confidence bound on the true p99 of the distribution `values` were drawn from: the
    k-th smallest value, k the least rank with P(k-th >= true p99) >= `confidence`. None where the
    values are too few for any rank to hold it (fewer than 299 at 95 %).

    Distribution-free: the count of values under the true p99 is Binomial(n, 0.99), and the k-th
    value is under it exactly when k or more are. The tail's sum is walked down from k = n in log
    space, so that 0.99^n never underflows."""
    n, q = len(values), 0.99
    log_ratio = math.log((1 - q) / q)
    log_term = n * math.log(q)  # log P(Binomial(n, q) == j), from j = n down
    below, rank = 0.0, n + 1  # below: P(Binomial(n, q) >= rank), the chance the rank-th is under the p99
    for j in range(n, 0, -1):
        term = math.exp(log_term)
        if below + term > 1 - confidence:
            break
        below += term
        rank = j
        log_term += math.log(j / (n - j + 1)) + log_ratio
    return None if rank > n else sorted(values)[rank - 1]


class DepthController:
    """One pool's live fit, tail and depth decisions. The caller applies the moves it returns."""

    def __init__(self, settings: ControlSettings, seed: int, now: float, floor: int = 1) -> None:
        self.settings = settings
        # The depth never falls below one query per instance: under it an instance idles while the
        # rest are refused (two CPU engines at depth 1, cut there by a mix of 64-text requests,
        # answered 5 requests a second and refused 55 for minutes).
        self.floor = max(1, int(floor))
        self.seed = max(1, int(seed))
        self.line = DecayedLine(settings.half_life)
        # Bounded so that a step stays cheap at any rate: at thousands of answers a second the tail
        # window is the last RECENT_SAMPLES answers rather than tail_window seconds of them.
        self.recent: deque[Sample] = deque(maxlen=RECENT_SAMPLES)
        self.observed = 0  # answers recorded, ever
        self.reason = "seed"
        self.holding: str | None = None  # why the last step held the depth, for /info
        self.changed_at = now  # the last move
        self.cut_at = now  # the last fall (or seed): what came after it vouches for a rise
        self._rises: list[tuple[float, int]] = []  # since then: (when, the depth it rose from)
        self._stepped_at = now
        # As of the last refresh, for readers off the event loop (a metrics scrape) and snapshots:
        # computing them there would race the loop's updates.
        self.current_fit: Line | None = None
        self.current_p99: float | None = None

    def reseed(self, seed: int, now: float, origin: str = "set_depth") -> None:
        """A new calibrated or probed depth: the depth restarts from it (the samples stay)."""
        self.seed = max(1, int(seed))
        self.reason = f"seeded at {self.seed} ({origin})"
        self.changed_at = self.cut_at = now
        self._rises = []

    @property
    def ceiling(self) -> int:
        return max(self.floor, math.floor(self.seed * self.settings.cap))

    def observe(self, concurrency: int, seconds: float, admitted: float, now: float) -> None:
        if concurrency < 1 or not (seconds >= 0 and math.isfinite(seconds)):
            return
        self.line.add(concurrency, seconds)
        self.recent.append(Sample(admitted, now, concurrency, seconds))
        self.observed += 1

    def crossing(self) -> int:
        """C* = (SLO - beta)/alpha * (1 - headroom), within [floor, ceiling]; the ceiling with no slope."""
        fit = self.current_fit
        if fit is None or fit.alpha <= 0:
            return self.ceiling
        settings = self.settings
        crossing = (settings.slo - fit.beta) / fit.alpha * (1 - settings.headroom)
        return max(self.floor, min(self.ceiling, math.floor(crossing)))

    def refresh(self, now: float) -> None:
        """Age the samples to `now` (decay the fit's weights, drop answers older than the tail window),
        then refit and retake the live p99 (of the whole window, whatever depth admitted them)."""
        self.line.decay(now - self._stepped_at)
        self._stepped_at = now
        horizon = now - self.settings.tail_window
        while self.recent and self.recent[0].answered < horizon:
            self.recent.popleft()
        self.current_fit = self.line.fit()
        self.current_p99 = p99([sample.seconds for sample in self.recent]) if self.recent else None

    def step(
        self, depth: int, full_since: float | None, now: float, overdue: Iterable[tuple[float, int]] = ()
    ) -> Move | None:
        """The depth to move to, or None to hold. `full_since`: when the pool first lacked room since
        the last move (None: it has not).
        `overdue`: (admitted, concurrency) of the pool's requests admitted more than an SLO ago and
        not answered yet."""
        self.refresh(now)
        settings = self.settings
        since_cut = [sample for sample in self.recent if sample.admitted >= self.cut_at]
        since_cut += [
            Sample(admitted, now, concurrency, now - admitted)
            for admitted, concurrency in overdue
            if admitted >= self.cut_at
        ]
        evidence = [sample for sample in since_cut if sample.admitted >= self.changed_at]
        if len(evidence) < settings.min_samples:
            self.holding = f"{len(evidence)} answers at depth {depth} so far; {settings.min_samples} judge it"
            return None
        comfortable = settings.slo * (1 - settings.headroom)
        tail, target = self._judge(evidence, comfortable)
        below = max(1, round(depth * settings.band_below))
        above = max(1, round(depth * settings.band_above))
        if tail > settings.slo:
            new = max(math.ceil(depth * (1 - settings.max_cut)), min(depth - 1, target))
            why, cause = f"p99 {tail:.3f} s > SLO {settings.slo:g} s", OVER_SLO
        elif tail >= comfortable and target <= depth - below:
            new = max(target, min(depth - 1, math.floor(depth * (1 - settings.up_step))))
            why, cause = f"p99 {tail:.3f} s >= {comfortable:.3f} s; C* = {target}", NEAR_SLO
        elif tail < comfortable and full_since is not None:
            target = self._rise_target(depth, evidence, since_cut, now, full_since)
            if target is None:
                return None
            if target < min(depth + above, self.ceiling) or target <= depth:
                self.holding = f"a rise would aim at {target}, within {above} of the depth"
                return None
            new = min(target, max(depth + 1, math.floor(depth * (1 + settings.up_step))))
            why, cause = f"p99 < {comfortable:.3f} s at 95 % confidence; C* = {target}", ROOM
        else:
            if tail < comfortable:
                self.holding = f"p99 {tail:.3f} s and room to spare since the last move"
            else:
                self.holding = f"p99 {tail:.3f} s inside the SLO; C* = {target}, within {below} of the depth"
            return None
        new = max(self.floor, min(self.ceiling, new))
        if new == depth:
            self.holding = f"at the bound of its range [{self.floor}, {self.ceiling}]"
            return None
        if (new > depth) != (cause == ROOM):
            # A depth set from outside the range (a profile's level, a calibration): the clamp would
            # move it against what its tail says, up while over the SLO.
            self.holding = f"outside its range [{self.floor}, {self.ceiling}], and the tail says {why}"
            return None
        self.holding = None
        self.reason = why
        self.changed_at = now
        if new < depth:
            self.cut_at, self._rises = now, []
        else:
            self._rises.append((now, depth))
        return Move(new, "up" if new > depth else "down", why, cause)

    def _rise_target(
        self, depth: int, evidence: list[Sample], since_cut: list[Sample], now: float, full_since: float
    ) -> int | None:
        """The depth a rise may aim at, or None while the answers cannot vouch for one.

        Only requests admitted at least an SLO ago may vouch. Of those admitted since a move, the
        ones answered so far are the fast ones; the slow ones are still running. Judged that
        early, a cut that had not yet shown looked like room, and the depth rose again under a
        tail still over the SLO. So those admitted at the depth in force an SLO ago or more
        (`min_samples` at least), and since the pool was full, must have a p99 inside the
        headroom. Answers admitted before it filled vouch for less than the depth: under clients
        fewer than the depth the depth rose on them, and the next level's clients, the first
        to fill the pool, met a depth no answer had tried (bench/DEPTH_CONTROL.md).

        And the p99 of a hundred or two answers is their slowest or second slowest: aimed by it, a
        rise went past where the true tail meets the headroom whenever the slowest few happened to
        come fast (bench/DEPTH_CONTROL.md, the hog runs). The aim comes from an upper bound at
        95 % confidence on the true p99 (p99_upper_bound: 299 answers or more) of the requests
        admitted an SLO ago or more since the last fall, each as its seconds per unit of the depth
        in force at its admission (a full pool's time grows about in proportion to its depth, as
        in _aim), so that every depth since the fall vouches. Not per query in flight at the
        admission: in a pool that answers a batch at a time that count swings by a batch or more,
        and the time with it far less (bench/DEPTH_CONTROL.md)."""
        settings = self.settings
        comfortable = settings.slo * (1 - settings.headroom)
        aged_now = [sample.seconds for sample in evidence if full_since <= sample.admitted <= now - settings.slo]
        if len(aged_now) < settings.min_samples:
            self.holding = (
                f"{len(aged_now)} answers admitted at depth {depth} since the pool filled, an SLO ago; "
                f"{settings.min_samples} vouch"
            )
            return None
        if (tail := p99(aged_now)) >= comfortable:
            self.holding = (
                f"p99 {tail:.3f} s of the answers admitted at depth {depth} since the pool filled, an SLO ago"
            )
            return None
        vouching = [
            sample.seconds / self._depth_at(sample.admitted, depth)
            for sample in since_cut
            if sample.admitted <= now - settings.slo
        ]
        per_depth = p99_upper_bound(vouching)
        if per_depth is None:
            self.holding = f"{len(vouching)} answers since the last fall; a 95 % bound on the p99 needs 299"
            return None
        return self._aim(1, per_depth, comfortable)

    def _depth_at(self, admitted: float, depth: int) -> int:
        """The depth in force at `admitted`, since the last fall; `depth` is the one now."""
        for at, before in self._rises:
            if admitted < at:
                return before
        return depth

    def _judge(self, samples: list[Sample], comfortable: float) -> tuple[float, int]:
        """The samples' p99, and the depth to aim at for it (_aim)."""
        tail = p99([sample.seconds for sample in samples])
        return tail, self._aim(max(sample.concurrency for sample in samples), tail, comfortable)

    def _aim(self, loaded: int, tail: float, comfortable: float) -> int:
        """The depth to aim at, for a tail `tail` at `loaded` queries in flight: the smaller of C*
        and the tail's own answer.

        The tail's own answer takes t about proportional to C: the level whose tail would sit at
        `comfortable`. It holds where the fit cannot: a saturated pool is admitted at one level
        only, and the fit then mixes that level's old and new speed into a flat line."""
        by_tail = math.floor(loaded * comfortable / tail) if tail > 0 else self.ceiling
        return max(self.floor, min(self.ceiling, self.crossing(), by_tail))

    def snapshot(self, now: float) -> dict:
        fit = self.current_fit
        tail = self.current_p99
        return {
            "seed": self.seed,
            "ceiling": self.ceiling,
            "fit": None
            if fit is None
            else {"alpha": fit.alpha, "beta": fit.beta, "samples": round(self.line.weight, 1), "levels": fit.levels},
            "crossing": self.crossing(),
            "live_p99": tail,
            "samples_in_window": len(self.recent),
            "observed": self.observed,
            "reason": self.reason,
            "holding": self.holding,
            "changed_at": self.changed_at,
            "seconds_since_change": now - self.changed_at,
        }
