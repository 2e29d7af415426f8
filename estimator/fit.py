"""Latency models fitted from profiling samples, and the queue depths they allow.

Paper model (eq. 10): tail latency (p99) `t = alpha*C + beta` at concurrency C, with alpha >= 0
and beta >= 0. Both are fitted as non-negative coefficients of the columns [C, 1]
(scikit-learn's `positive=True` does not constrain an intercept, so beta is the
coefficient of a constant column instead); that is the exact least-squares solution under
the constraint (non-negative least squares).

Length-aware model (beyond the paper): `t = C*(a*L + q*L^2 + b) + c` for C queries of L
tokens: a cost per token in flight, an attention cost that grows with the square of the
length (self-attention is quadratic; on MiniLM/CPU a 256-token query costs ~1.7x per token
what a 32-token one does), a cost per query and a constant. It turns the depth into a token
budget so that admission can count (charged) tokens instead of queries. The q term is only
fitted when three or more lengths were profiled; with two it cannot be told from a and b.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score

# Depth used when latency does not grow with concurrency in the fit (alpha == 0): the
# formula gives infinity, and nothing measured supports any particular finite number.
# Callers pass the largest concurrency they are willing to trust (the profile's maximum).
DEFAULT_DEPTH_CAP = 4096

# The share of the SLO a depth keeps in reserve, unless told otherwise: at the exact formula the
# measured tail sits on the SLO and misses it about half the time by noise alone (figures:
# bench/ESTIMATOR.md, "Headroom").
DEFAULT_HEADROOM = 0.15

# Relative slack for float round-off, so that a depth landing exactly on the SLO counts.
_REL_TOL = 1e-9


@dataclass(frozen=True)
class LinearFit:
    """t = alpha*C + beta (seconds), fitted on `points` levels."""

    alpha: float
    beta: float
    r2: float
    points: int

    def predict(self, concurrency: float) -> float:
        return self.alpha * concurrency + self.beta

    def crossing(self, latency: float) -> float | None:
        """The concurrency (unrounded) at which the line reaches `latency`; None without a slope."""
        return (latency - self.beta) / self.alpha if self.alpha > 0 else None


@dataclass(frozen=True)
class LengthFit:
    """t = C*(per_token*L + per_token_squared*L^2 + per_query) + constant (seconds), on lengths min..max."""

    per_token: float
    per_query: float
    constant: float
    r2: float
    points: int
    min_length: int
    max_length: int
    per_token_squared: float = 0.0  # 0 in files written before the attention term existed

    def query_cost(self, length: float) -> float:
        """Seconds one more query of `length` tokens in flight adds to the tail."""
        return self.per_token * length + self.per_token_squared * length * length + self.per_query

    def predict(self, concurrency: float, length: float) -> float:
        return self.query_cost(length) * concurrency + self.constant

    @property
    def per_query_tokens(self) -> int | None:
        """The per-query cost in tokens of per-token cost: what admission adds to each length."""
        return math.ceil(self.per_query / self.per_token) if self.per_token > 0 else None

    @property
    def squared_token_ratio(self) -> float | None:
        """Tokens charged per squared token of length: the attention cost in per-token units."""
        return self.per_token_squared / self.per_token if self.per_token > 0 else None

    def charge(self, length: int) -> int:
        """Token-equivalents a query of `length` is charged: L + ceil(q/a * L^2) + ceil(b/a).

        Each part is rounded up, so per_token * charge >= query_cost: a budget in charged
        tokens never admits more than the fit allows.
        """
        if self.per_token <= 0:
            raise ValueError("latency does not grow with length in this fit: there is no token charge")
        ratio = self.squared_token_ratio or 0.0
        return length + math.ceil(ratio * length * length) + (self.per_query_tokens or 0)

    def at_length(self, length: int) -> LinearFit:
        """The query-count model this fit implies for queries of one length."""
        return LinearFit(alpha=self.query_cost(length), beta=self.constant, r2=self.r2, points=self.points)


@dataclass(frozen=True)
class DepthDecision:
    """The deepest queue that meets the SLO, or None when the pool cannot meet it at all."""

    depth: int | None
    reason: str
    capped: bool = False
    bounded: bool = False  # set by estimator.profile.decide_profile_depth: a measured level overruled the line


def _nonnegative_least_squares(columns: np.ndarray, latency: np.ndarray) -> tuple[np.ndarray, float]:
    """The least-squares coefficients of `columns`, all >= 0, and the fit's R^2."""
    model = LinearRegression(positive=True, fit_intercept=False).fit(columns, latency)
    coefficients = np.clip(model.coef_, 0.0, None)  # the solver may return -0.0
    return coefficients, float(r2_score(latency, columns @ coefficients))


def _as_samples(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite (drop levels whose tail failed before fitting)")
    return array


def fit_linear(concurrency: Sequence[float], latency: Sequence[float]) -> LinearFit:
    """Fit t = alpha*C + beta with alpha, beta >= 0; needs two or more distinct concurrencies."""
    c = _as_samples("concurrency", concurrency)
    t = _as_samples("latency", latency)
    if len(c) != len(t):
        raise ValueError(f"{len(c)} concurrency values but {len(t)} latencies")
    if len(np.unique(c)) < 2:
        raise ValueError("a linear fit needs samples at two or more different concurrency levels")
    if np.any(c <= 0) or np.any(t < 0):
        raise ValueError("concurrency must be positive and latency non-negative")
    columns = np.column_stack([c, np.ones_like(c)])
    (alpha, beta), r2 = _nonnegative_least_squares(columns, t)
    return LinearFit(alpha=float(alpha), beta=float(beta), r2=r2, points=len(c))


def fit_length_aware(concurrency: Sequence[float], length: Sequence[float], latency: Sequence[float]) -> LengthFit:
    """Fit t = C*(a*L + q*L^2 + b) + c with a, q, b, c >= 0 (q = 0 with fewer than three lengths).

    Needs two or more lengths and three or more samples.
    """
    c = _as_samples("concurrency", concurrency)
    n = _as_samples("length", length)
    t = _as_samples("latency", latency)
    if not len(c) == len(n) == len(t):
        raise ValueError("concurrency, length and latency must have the same number of samples")
    if len(np.unique(n)) < 2 or len(c) < 3:
        raise ValueError("a length-aware fit needs three or more samples over two or more lengths")
    if np.any(c <= 0) or np.any(n <= 0) or np.any(t < 0):
        raise ValueError("concurrency and length must be positive and latency non-negative")
    attention = c * n * n if len(np.unique(n)) >= 3 else np.zeros_like(c)
    columns = np.column_stack([c * n, attention, c, np.ones_like(c)])
    (per_token, per_token_squared, per_query, constant), r2 = _nonnegative_least_squares(columns, t)
    return LengthFit(
        per_token=float(per_token),
        per_query=float(per_query),
        constant=float(constant),
        r2=r2,
        points=len(c),
        min_length=int(n.min()),
        max_length=int(n.max()),
        per_token_squared=float(per_token_squared),
    )


def _meets(predicted: float, slo: float) -> bool:
    return predicted <= slo * (1 + _REL_TOL)


def _check_slo(slo: float) -> None:
    if not (slo > 0 and math.isfinite(slo)):
        raise ValueError(f"the SLO must be a positive number of seconds, got {slo!r}")


def _check_headroom(headroom: float) -> None:
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be a fraction in [0, 1), got {headroom!r}")


def decide_depth(fit: LinearFit, slo: float, cap: int = DEFAULT_DEPTH_CAP, headroom: float = 0.0) -> DepthDecision:
    """C_max = floor((T*(1 - headroom) - beta) / alpha), with the paper's eq. 11 and alpha = 0 edges.

    `headroom` (default 0: the paper's formula) keeps the predicted tail that fraction below
    the SLO: at the exact C_max the measured tail sits on the SLO and misses it about half
    the time by noise alone. Eq. 11 is judged on T itself: a pool is unusable only when one
    query alone misses the SLO; if it fits T but not the headroom, the depth is 1.
    """
    _check_slo(slo)
    _check_headroom(headroom)
    if cap < 1:
        raise ValueError(f"the depth cap must be >= 1, got {cap}")
    single = fit.predict(1)
    if not _meets(single, slo):
        return DepthDecision(
            None, f"one query alone takes {single:.3f} s by the fit (alpha + beta > T = {slo:g} s): unusable"
        )
    target = slo * (1 - headroom)
    crossing = fit.crossing(target)
    if crossing is None or crossing >= cap:
        why = "latency does not grow with concurrency" if crossing is None else "the formula exceeds the cap"
        return DepthDecision(cap, f"{why}; capped at {cap}", capped=True)
    depth = max(1, math.floor(crossing))
    if _meets(fit.predict(depth + 1), target):  # the division rounded down across the boundary
        depth += 1
    shown_t = f"{slo:g}" if headroom == 0 else f"{slo:g}*(1 - {headroom:g})"
    return DepthDecision(depth, f"floor((T - beta) / alpha) = floor(({shown_t} - {fit.beta:.4g}) / {fit.alpha:.4g})")


def depth_for_slo(
    fit: LinearFit, slo: float, cap: int = DEFAULT_DEPTH_CAP, headroom: float = 0.0
) -> int | None:
    """The deepest queue that meets `slo`; None when a single query already misses it."""
    return decide_depth(fit, slo, cap, headroom).depth


def token_budget_for_slo(
    fit: LengthFit, slo: float, cap_tokens: int = DEFAULT_DEPTH_CAP * 512, headroom: float = 0.0
) -> int | None:
    """Charged tokens in flight that keep the SLO for any mix of query lengths.

    Admission charges each query `fit.charge(length)`: its length plus its attention and
    per-query costs expressed in tokens, rounded up. Then a*charged + c <= T implies
    sum(query_cost) + c <= T for every mix, and it is tight: nothing is reserved for
    lengths that do not come. None when one query of the shortest profiled length already
    misses the SLO, or when latency does not grow with length (admit by query depth then).
    `headroom` as in decide_depth.
    """
    _check_slo(slo)
    _check_headroom(headroom)
    if fit.per_token <= 0 or not _meets(fit.predict(1, fit.min_length), slo):
        return None
    budget = max(0.0, slo * (1 - headroom) - fit.constant) / fit.per_token
    if budget >= cap_tokens:
        return cap_tokens
    one_query = fit.charge(fit.min_length)  # it meets T, so admit at least it
    return max(one_query, math.floor(budget * (1 + _REL_TOL)))
