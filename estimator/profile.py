"""Profile one pool: closed-loop rounds at rising concurrency until the tail passes the SLO.

Levels double (1, 2, 4, ...) while the fit so far says the SLO is far away. Once the
doubling would pass the predicted crossing, the next level is aimed just past it instead
(`overshoot`), so that the last, most expensive points sit right at the boundary where the
depth is read off, and no level costs much more than the SLO itself.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from estimator.fit import fit_linear
from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit, measure_level, warm_up


@dataclass(frozen=True)
class Profile:
    samples: tuple[LevelSample, ...]
    seconds: float
    stop_reason: str


def finite_samples(samples: tuple[LevelSample, ...] | list[LevelSample]) -> list[LevelSample]:
    return [sample for sample in samples if math.isfinite(sample.p95)]


def next_level(samples: list[LevelSample], slo: float, overshoot: float) -> int:
    """Double, or aim just past the SLO crossing the fit predicts if that comes sooner."""
    current = samples[-1].concurrency
    usable = finite_samples(samples)
    if len({sample.concurrency for sample in usable}) < 2:
        return current * 2
    fit = fit_linear([s.concurrency for s in usable], [s.p95 for s in usable])
    if fit.alpha <= 0:
        return current * 2
    crossing = (slo - fit.beta) / fit.alpha
    aimed = math.ceil(crossing * (1 + overshoot))
    # A pessimistic fit (crossing below a level that still met) must still make progress.
    return max(math.ceil(current * 1.25), min(aimed, current * 2))


async def profile_pool(
    submit: Submit,
    make_query: MakeQuery,
    slo: float,
    *,
    query_tokens: int = 75,
    rounds: int = 5,
    max_concurrency: int = 256,
    min_levels: int = 2,
    overshoot: float = 0.05,
    warmup_concurrency: int = 4,
    request_timeout: float | None = None,
    pool: str = "pool",
    stage: str = "profile",
    progress: ProgressHook | None = None,
) -> Profile:
    """Measure levels until one's p95 exceeds `slo` (after at least `min_levels` levels)."""
    if slo <= 0 or rounds < 1 or max_concurrency < 1 or query_tokens < 1:
        raise ValueError("slo, rounds, max_concurrency and query_tokens must be positive")
    started = time.perf_counter()
    await warm_up(submit, make_query, query_tokens, min(warmup_concurrency, max_concurrency), request_timeout)
    samples: list[LevelSample] = []
    concurrency = 1
    while True:
        sample = await measure_level(
            submit,
            make_query,
            concurrency,
            query_tokens,
            rounds,
            timeout=request_timeout,
            stage=stage,
            pool=pool,
            progress=progress,
        )
        samples.append(sample)
        enough = len(samples) >= min_levels
        if enough and not sample.meets(slo):
            reason = f"p95 {sample.p95:.3f} s > SLO {slo:g} s at C={concurrency}"
            break
        if concurrency >= max_concurrency:
            reason = f"reached max concurrency {max_concurrency} within the SLO"
            break
        concurrency = min(max_concurrency, next_level(samples, slo, overshoot))
    return Profile(tuple(samples), time.perf_counter() - started, reason)
