"""Where each pool's queue depth comes from: a setting, a calibration, or a warm-up probe.

Every depth aims at the SLO on the p99 of latency. With adaptive depth control it is the seed the
dispatcher's online controller starts from; with static control, the depth itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from estimator import DEFAULT_HEADROOM, Calibration, LengthFit, LinearFit, decide_depth, decide_profile_depth
from estimator.fit import DepthDecision
from queue_manager.depth_control import p99
from queue_manager.pool import TokenCharge

log = logging.getLogger(__name__)

PROBE_TOKENS = 75  # the paper's query length
# Marks the warm-up probe's requests: front ends leave them out of the request metrics, which a
# deploy had left at 843 requests mostly over the SLO before the first client's.
WARM_UP_HEADER = "x-windve-warm-up"


@dataclass
class DepthSource:
    """A pool's depth and its origin, for /info and the start-up log."""

    pool: str
    depth: int
    source: str  # setting | calibration (origin) | warm-up probe (http | in-process)
    token_budget: int | None = None
    token_charge: TokenCharge = TokenCharge()  # what a query counts against the token budget
    detail: dict[str, Any] = field(default_factory=dict)


def token_charge_for(fit: LengthFit) -> TokenCharge:
    """The queue manager's charge rule for a length-aware fit: the same as `fit.charge`."""
    return TokenCharge(fit.per_query_tokens or 0, fit.squared_token_ratio or 0.0)


def depth_from_calibration(calibration: Calibration, pool: str, slo: float, origin: str) -> DepthSource | None:
    """The calibrated depth at `slo`; derived from the fit when that SLO was not profiled."""
    measured = calibration.pools.get(pool)
    if measured is None:
        return None
    try:
        entry = measured.at(slo)
        depth, reason = entry.estimate, entry.reason
        token_budget = entry.token_budget
    except KeyError:
        decision = decide_profile_depth(measured.samples, measured.fit, slo, headroom=calibration.headroom)
        depth, reason, token_budget = decision.depth, decision.reason, None
        deepest = max((sample.concurrency for sample in measured.samples), default=0)
        profiled = ", ".join(f"{entry.slo:g}" for entry in measured.depths)
        if depth is not None and depth > deepest:
            # Read off the line past every level measured (a calibration at 0.25 s and 32 clients gave
            # 448 at 1 s): depth control, if adaptive, corrects it from live answers, no faster.
            reason += f"; SLO {slo:g} s was not profiled (calibrated at {profiled} s), deepest level measured {deepest}"
            log.warning(
                "pool %s: depth %d at SLO %g s is read off the calibration's line past the deepest level it "
                "measured (%d; calibrated at %s s): calibrate at this SLO", pool, depth, slo, deepest, profiled,
            )  # fmt: skip
    if depth is None:
        log.warning("pool %s cannot meet the %.3g s SLO (%s): it takes no queries", pool, slo, reason)
    if measured.recheck is not None and not measured.recheck.steady:
        log.warning("pool %s calibration: %s", pool, measured.recheck.describe())
    moved = calibration.crossing_moved(pool)
    if moved is not None:
        log.log(logging.WARNING if moved.slower else logging.INFO, "pool %s calibration: %s", pool, moved.describe())
    charge = TokenCharge()
    if token_budget is not None and measured.length_fit is not None:
        charge = token_charge_for(measured.length_fit)
    return DepthSource(
        pool,
        depth or 0,
        origin,
        token_budget=token_budget,
        token_charge=charge,
        detail={"alpha": measured.fit.alpha, "beta": measured.fit.beta, "r2": measured.fit.r2, "reason": reason},
    )


# (clients, queries each) -> every answer's latency in seconds, in the order the answers came. Each
# client sends its next query as soon as its last is answered; all start together.
ClosedLoop = Callable[[int, int], Awaitable[list[float]]]

STEADY_QUERIES = 6  # per client in the steady and settled rounds, of which 4 x the clients' answers are counted
STEADY_BATCHES = 2  # the steady round's clients, in full batches (per instance, as engine processes pipeline them)
# The settled round's clients at most, in steady rounds' worth: a depth read off a line with no slope
# (the cap, 4,096) must not open thousands of connections at start.
SETTLED_REACH = 4
# A settled level this close to the steady one, relative to it, measures nothing the steady round did not.
SAME_LEVEL = 0.10


def probe_room(batch: int) -> int:
    """The depth a probed pool needs meanwhile: twice the probe's most clients (a remote front end
    checks room on a board refreshed every few milliseconds; a stale one must not refuse the probe)."""
    return 2 * SETTLED_REACH * STEADY_BATCHES * batch


async def _steady_tail(closed_loop: ClosedLoop, clients: int) -> tuple[float, list[float]]:
    """The p99 of a closed loop of `clients`, each sending STEADY_QUERIES queries back to back, over
    the answers after the first `clients` and before the last (the burst that fills the queues and
    the drain that empties them); and those answers."""
    latencies = await closed_loop(clients, STEADY_QUERIES)
    steady = latencies[clients:-clients]
    return p99(steady), steady


async def probe_rounds(
    pool: str, closed_loop: ClosedLoop, batch: int, slo: float, path: str, query_tokens: int
) -> DepthSource:
    """The depth a pool starts with when neither a setting nor a calibration gives one, from the
    line p99 `latency = alpha*C + beta` through two points; the online depth controller moves on
    from it.

    One query alone gives beta. The steady round puts the pool in its steady state: C = 2 x `batch`
    clients (two full batches per instance, as engine processes pipeline them) in a closed loop
    (`_steady_tail`); the line through beta and its tail gives a first depth. A burst of one batch,
    timed to its last answer, read the pool 25-35 % too fast: it has no batch queued ahead of it, no
    other batch's requests being read and answered by the front end meanwhile, and it times the mean
    wait rather than the tail, which sat at 1.4x the mean in a closed loop here (bench/ESTIMATOR.md).

    The settled round measures the tail at that first depth the same way (at most SETTLED_REACH
    steady rounds' worth of clients), and the depth is read off the line through beta and it: read
    from a level 1.5x past it, the first depth sat between the headroom's crossing and the SLO's,
    and depth control cut it under clients as many as the depth (bench/SERVED.md). Where the first
    depth is within SAME_LEVEL of the steady level, that round's tail is the settled one.

    A first, unmeasured round lets the kernels meet these shapes before the clock runs. The depth
    keeps `windve calibrate`'s default headroom. `path` says what the rounds went through ("http":
    the service's own front end, windve.probe; "in-process": the pool's queue, `probe_depth`), for /info.
    """
    await closed_loop(batch, 1)
    beta = min([(await closed_loop(1, 1))[0] for _ in range(3)])
    clients = STEADY_BATCHES * batch
    tail, steady = await _steady_tail(closed_loop, clients)
    first = _depth_on(_line_through(beta, clients, tail), slo)
    settled_clients, settled_tail = clients, tail
    if first.depth is not None and abs(first.depth - clients) > SAME_LEVEL * clients:
        settled_clients = min(first.depth, SETTLED_REACH * clients)
        settled_tail, _ = await _steady_tail(closed_loop, settled_clients)
    line = _line_through(beta, settled_clients, settled_tail)
    decision = _depth_on(line, slo)
    # Even a pool too slow for the SLO serves one query at a time: refusing everything at
    # start, on a few rounds of evidence, would be worse than a late answer.
    return DepthSource(
        pool,
        decision.depth or 1,
        f"warm-up probe ({path})",
        detail={
            "alpha": line.alpha,
            "beta": beta,
            "query_tokens": query_tokens,
            "batch": batch,
            "steady_clients": clients,
            "steady_p99": tail,
            "steady_queries_per_s": clients * len(steady) / sum(steady),  # Little's law
            "first_depth": first.depth,
            "settled_clients": settled_clients,
            "settled_p99": settled_tail,
            "path": path,
            "reason": decision.reason,
        },
    )


def _line_through(beta: float, clients: int, tail: float) -> LinearFit:
    """The line from one query alone (`beta`) to the tail `tail` at `clients`."""
    return LinearFit(max(tail - beta, 0.0) / max(1, clients - 1), beta, r2=math.nan, points=2)


def _depth_on(line: LinearFit, slo: float) -> DepthDecision:
    return decide_depth(line, slo, headroom=DEFAULT_HEADROOM)


async def probe_depth(
    pool: str, submit: Callable[[Sequence[np.ndarray]], Awaitable[Any]], query: np.ndarray, batch: int, slo: float
) -> DepthSource:
    """The warm-up probe in this process: `probe_rounds` through `submit`, the pool's own queue.

    That is the queue manager's dispatch and batching and the engines, with token ids made in
    advance: no HTTP, validation, tokenizing or answer writing, so it reads the pool faster than a
    client sees it. The service probes over HTTP (windve.probe) where its front end listens; this is
    the fallback where none does (the runtime embedded in tests or the estimator), or where the
    HTTP probe failed.
    """
    loop = asyncio.get_running_loop()

    async def client(queries: int, answered: list[float]) -> None:
        for _ in range(queries):
            started = loop.time()  # the loop's clock: exact for a simulated pool on a virtual clock
            await submit([query])
            answered.append(loop.time() - started)

    async def closed_loop(clients: int, queries: int) -> list[float]:
        answered: list[float] = []
        await asyncio.gather(*(client(queries, answered) for _ in range(clients)))
        return answered

    return await probe_rounds(pool, closed_loop, batch, slo, "in-process", len(query))
