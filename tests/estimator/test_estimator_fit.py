"""The constrained fits and the depth formulas (paper eq. 10-11), against independent solvers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import lsq_linear

from estimator.fit import (
    LengthFit,
    LinearFit,
    decide_depth,
    depth_for_slo,
    fit_length_aware,
    fit_linear,
    token_budget_for_slo,
)
from windve.depths import token_charge_for

LEVELS = [1, 2, 4, 8, 16, 32, 64]


def _constrained_optimum(columns: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Bounded least squares by a different algorithm (trust region), as the reference."""
    return lsq_linear(columns, latency, bounds=(0, np.inf), method="bvls").x


def test_noiseless_samples_recover_alpha_and_beta() -> None:
    latency = [0.012 * c + 0.05 for c in LEVELS]
    fit = fit_linear(LEVELS, latency)
    assert fit.alpha == pytest.approx(0.012, rel=1e-6)
    assert fit.beta == pytest.approx(0.05, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.points == len(LEVELS)


def test_noisy_samples_recover_alpha_and_beta_closely() -> None:
    rng = np.random.default_rng(7)
    concurrency = np.repeat(LEVELS, 5)
    latency = 0.02 * concurrency + 0.1 + rng.normal(0, 0.005, concurrency.size)
    fit = fit_linear(concurrency, latency)
    assert fit.alpha == pytest.approx(0.02, rel=0.02)
    assert fit.beta == pytest.approx(0.1, abs=0.01)
    assert fit.r2 > 0.99


def test_negative_slope_clamps_alpha_to_zero_and_beta_to_the_mean() -> None:
    latency = np.array([1.0 - 0.01 * c for c in LEVELS])
    fit = fit_linear(LEVELS, latency)
    assert fit.alpha == 0.0
    # With alpha pinned at 0 the least-squares beta is the mean latency.
    assert fit.beta == pytest.approx(latency.mean())
    assert fit.r2 <= 0.0  # a constant explains none of the variance


def test_negative_intercept_clamps_beta_to_zero_and_refits_the_slope() -> None:
    c = np.array(LEVELS, dtype=float)
    latency = 0.02 * c - 0.015  # every latency positive, the line's intercept negative
    fit = fit_linear(c, latency)
    assert fit.beta == 0.0
    # Least squares through the origin: alpha = sum(C t) / sum(C^2).
    assert fit.alpha == pytest.approx(float(c @ latency / (c @ c)))
    reference = _constrained_optimum(np.column_stack([c, np.ones_like(c)]), latency)
    assert [fit.alpha, fit.beta] == pytest.approx(reference.tolist(), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    slope=st.floats(-0.05, 0.05),
    intercept=st.floats(-0.5, 0.5),
    noise=st.lists(st.floats(-0.05, 0.05), min_size=len(LEVELS), max_size=len(LEVELS)),
)
def test_fit_is_the_constrained_least_squares_solution(slope: float, intercept: float, noise: list[float]) -> None:
    c = np.array(LEVELS, dtype=float)
    latency = np.clip(slope * c + intercept + np.array(noise), 0, None)
    fit = fit_linear(c, latency)
    assert fit.alpha >= 0 and fit.beta >= 0
    columns = np.column_stack([c, np.ones_like(c)])
    reference = _constrained_optimum(columns, latency)
    ours = np.sum((columns @ [fit.alpha, fit.beta] - latency) ** 2)
    best = np.sum((columns @ reference - latency) ** 2)
    assert ours <= best + 1e-10


@pytest.mark.parametrize(
    ("concurrency", "latency", "message"),
    [
        ([4, 4, 4], [0.1, 0.2, 0.3], "two or more different concurrency"),
        ([1, 2], [0.1], "2 concurrency values but 1"),
        ([1, 2], [0.1, math.inf], "finite"),
        ([0, 2], [0.1, 0.2], "positive"),
    ],
)
def test_fit_rejects_unfittable_samples(concurrency, latency, message) -> None:
    with pytest.raises(ValueError, match=message):
        fit_linear(concurrency, latency)


def _fit(alpha: float, beta: float) -> LinearFit:
    return LinearFit(alpha=alpha, beta=beta, r2=1.0, points=5)


def test_depth_is_floor_of_slo_minus_beta_over_alpha() -> None:
    assert depth_for_slo(_fit(0.1, 0.2), 1.0) == 8
    assert depth_for_slo(_fit(0.03, 0.1), 1.0) == 30  # 0.9 / 0.03 = 30 exactly; floats give 29.999...


def test_depth_landing_exactly_on_the_slo_counts() -> None:
    # 0.1 * 5 + 0.2 = 0.7, and (0.7 - 0.2) / 0.1 is 4.999999999999999 in floating point.
    assert (0.7 - 0.2) / 0.1 < 5
    assert depth_for_slo(_fit(0.1, 0.2), 0.7) == 5


def test_single_query_exactly_at_the_slo_is_usable_with_depth_one() -> None:
    assert depth_for_slo(_fit(0.25, 0.75), 1.0) == 1


def test_pool_whose_single_query_misses_the_slo_is_unusable() -> None:
    decision = decide_depth(_fit(0.3, 0.8), 1.0)
    assert decision.depth is None
    assert "unusable" in decision.reason and "1.100" in decision.reason


def test_headroom_aims_below_the_slo_but_eq_11_is_judged_on_the_slo() -> None:
    assert depth_for_slo(_fit(0.1, 0.2), 1.0, headroom=0.1) == 7  # floor((0.9 - 0.2) / 0.1)
    assert "1*(1 - 0.1)" in decide_depth(_fit(0.1, 0.2), 1.0, headroom=0.1).reason
    # One query (0.95 s) fits T = 1 s but not 0.9 s: still usable, one at a time.
    assert depth_for_slo(_fit(0.5, 0.45), 1.0, headroom=0.1) == 1
    with pytest.raises(ValueError, match="headroom"):
        depth_for_slo(_fit(0.1, 0.2), 1.0, headroom=1.0)


def test_flat_latency_gives_the_cap_and_says_so() -> None:
    decision = decide_depth(_fit(0.0, 0.2), 1.0, cap=256)
    assert decision.depth == 256 and decision.capped
    assert "does not grow" in decision.reason
    assert depth_for_slo(_fit(0.0, 1.5), 1.0) is None  # flat but above the SLO: still unusable


def test_depth_beyond_the_cap_is_capped() -> None:
    decision = decide_depth(_fit(0.001, 0.0), 1.0, cap=64)
    assert decision.depth == 64 and decision.capped


@pytest.mark.parametrize("slo", [0.0, -1.0, math.inf, math.nan])
def test_depth_rejects_a_non_positive_slo(slo: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        depth_for_slo(_fit(0.1, 0.1), slo)


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(1e-4, 1.0), beta=st.floats(0.0, 1.0), slo=st.floats(0.01, 5.0))
def test_depth_is_the_largest_concurrency_the_fit_lets_meet_the_slo(alpha: float, beta: float, slo: float) -> None:
    depth = depth_for_slo(_fit(alpha, beta), slo, cap=10**9)
    tolerance = slo * 1e-9
    if alpha + beta > slo + tolerance:
        assert depth is None
        return
    assert depth is not None and depth >= 1
    assert alpha * depth + beta <= slo + tolerance
    assert alpha * (depth + 1) + beta > slo - tolerance


def _length_rows(lengths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rows = [(c, n) for n in lengths for c in LEVELS]
    return np.array([r[0] for r in rows], dtype=float), np.array([r[1] for r in rows], dtype=float)


def test_length_aware_fit_recovers_its_coefficients() -> None:
    c, n = _length_rows((16, 75, 256))
    latency = 2e-5 * c * n + 8e-8 * c * n * n + 1e-3 * c + 0.01
    fit = fit_length_aware(c, n, latency)
    assert fit.per_token == pytest.approx(2e-5, rel=1e-6)
    assert fit.per_token_squared == pytest.approx(8e-8, rel=1e-6)
    assert fit.per_query == pytest.approx(1e-3, rel=1e-6)
    assert fit.constant == pytest.approx(0.01, rel=1e-6)
    assert (fit.min_length, fit.max_length) == (16, 256)
    assert fit.r2 == pytest.approx(1.0)


def test_length_aware_fit_leaves_out_attention_with_two_lengths() -> None:
    c, n = _length_rows((16, 256))  # with two lengths, L^2 is a mix of L and 1: not identifiable
    fit = fit_length_aware(c, n, 2e-5 * c * n + 1e-3 * c + 0.01)
    assert fit.per_token_squared == 0.0
    assert (fit.per_token, fit.per_query) == (pytest.approx(2e-5, rel=1e-6), pytest.approx(1e-3, rel=1e-6))


def test_length_aware_fit_needs_two_lengths() -> None:
    with pytest.raises(ValueError, match="two or more lengths"):
        fit_length_aware([1, 2, 4], [75, 75, 75], [0.1, 0.2, 0.3])


def _length_fit(
    per_token: float = 2e-5, per_query: float = 1e-3, constant: float = 0.01, per_token_squared: float = 0.0
) -> LengthFit:
    return LengthFit(per_token, per_query, constant, r2=1.0, points=9, min_length=16, max_length=256,
                     per_token_squared=per_token_squared)


@pytest.mark.parametrize("per_token_squared", [0.0, 8e-8])
def test_token_budget_keeps_any_mix_of_lengths_within_the_slo(per_token_squared: float) -> None:
    fit = _length_fit(per_token_squared=per_token_squared)
    slo = 0.5
    budget = token_budget_for_slo(fit, slo)
    assert budget is not None and fit.per_query_tokens == 50  # 1e-3 / 2e-5 tokens per query
    rng = np.random.default_rng(3)
    for _ in range(200):
        lengths = []
        while True:  # admit queries, each charged by the fit, while the budget allows
            length = int(rng.choice([4, 16, 40, 75, 128, 256, 512]))
            if sum(fit.charge(n) for n in lengths) + fit.charge(length) > budget:
                break
            lengths.append(length)
        predicted = sum(fit.query_cost(n) for n in lengths) + fit.constant
        assert predicted <= slo + 1e-12


def test_the_queue_manager_charges_what_the_budget_assumes() -> None:
    fit = _length_fit(per_token_squared=8e-8)
    charge = token_charge_for(fit)
    for length in range(1, 600):
        assert charge(length) == fit.charge(length)
        assert fit.per_token * charge(length) >= fit.query_cost(length) * (1 - 1e-12)


def test_token_budget_admits_as_many_queries_of_one_length_as_the_query_depth() -> None:
    fit = _length_fit()
    budget = token_budget_for_slo(fit, 0.5)
    for length in (16, 75, 256):
        assert budget // (length + fit.per_query_tokens) == depth_for_slo(fit.at_length(length), 0.5)


def test_token_budget_is_none_when_one_short_query_misses_or_length_does_not_matter() -> None:
    assert token_budget_for_slo(_length_fit(constant=1.0), 0.5) is None
    flat = _length_fit(per_token=0.0)
    assert token_budget_for_slo(flat, 0.5) is None and flat.per_query_tokens is None
