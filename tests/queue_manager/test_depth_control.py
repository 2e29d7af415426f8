"""Online depth control: the live fit, the controller's steps, and a pool that slows down and recovers,
all on virtual clocks."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from estimator.fit import DEFAULT_HEADROOM as CALIBRATION_HEADROOM
from queue_manager.depth_control import (
    CAUSES,
    DEFAULT_HEADROOM,
    ControlSettings,
    DecayedLine,
    DepthController,
    fit_nonnegative,
    p99,
    p99_upper_bound,
)
from queue_manager.manager import QueueManager
from queue_manager.pool import TokenCharge
from queue_manager.protocol import Busy
from queue_manager.simulation import Scenario, run_scenario
from tests.queue_manager.doubles import ControlledInstance, InstantInstance, queries, settle


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_headroom_is_the_calibrations():
    assert DEFAULT_HEADROOM == CALIBRATION_HEADROOM


# ---- the fit ----------------------------------------------------------------------------


def weighted_error(alpha, beta, levels, means, weights) -> float:
    return sum(w * (t - alpha * c - beta) ** 2 for c, t, w in zip(levels, means, weights))


@given(
    points=st.lists(
        st.tuples(st.integers(1, 200), st.floats(0, 5), st.floats(0.01, 10)),
        min_size=2,
        max_size=12,
        unique_by=lambda point: point[0],
    )
)
def test_the_fit_is_the_best_nonnegative_line(points):
    levels, means, weights = (list(column) for column in zip(*points))
    line = fit_nonnegative(levels, means, weights)
    assert line is not None and line.alpha >= 0 and line.beta >= 0
    best = weighted_error(line.alpha, line.beta, levels, means, weights)
    # No non-negative line near it, nor on either boundary, does better.
    candidates = itertools.product(
        [0.0, line.alpha * 0.9, line.alpha * 1.1, line.alpha + 1e-3],
        [0.0, line.beta * 0.9, line.beta * 1.1, line.beta + 1e-3],
    )
    for alpha, beta in candidates:
        assert best <= weighted_error(alpha, beta, levels, means, weights) * (1 + 1e-9) + 1e-12


@given(alpha=st.floats(0, 0.1), beta=st.floats(0, 2))
def test_the_fit_recovers_a_line_exactly(alpha, beta):
    levels = [1, 5, 20, 60]
    line = fit_nonnegative(levels, [alpha * c + beta for c in levels], [1.0, 2.0, 3.0, 0.5])
    assert line.alpha == pytest.approx(alpha, abs=1e-9) and line.beta == pytest.approx(beta, abs=1e-9)


def test_one_level_is_no_line():
    assert fit_nonnegative([8], [0.5], [3.0]) is None


def test_old_samples_fade_with_the_half_life():
    line = DecayedLine(half_life=2.0)
    for c in (10, 20):
        line.add(c, 0.01 * c)  # t = 0.01 C
    line.decay(2.0)
    assert line.weight == pytest.approx(1.0)  # two samples, one half-life
    for c in (10, 20):
        for _ in range(30):
            line.add(c, 0.02 * c + 0.1)  # the pool slowed: t = 0.02 C + 0.1
    fit = line.fit()
    assert fit.alpha == pytest.approx(0.02, rel=0.05) and fit.beta == pytest.approx(0.1, rel=0.1)


# ---- the controller ---------------------------------------------------------------------

SETTINGS = ControlSettings(slo=1.0, min_samples=10)


def feed(controller: DepthController, clock: Clock, concurrency: int, seconds: float, count: int = 10) -> None:
    for _ in range(count):
        controller.observe(concurrency, seconds, admitted=clock.now, now=clock.now + seconds)
    clock.now += seconds


def test_a_tail_over_the_slo_cuts_the_depth_at_once_but_at_most_by_half():
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0)
    feed(controller, clock, 40, 1.2)
    move = controller.step(40, full_since=0.0, now=clock.now)
    # The tail says 40 * 0.85 / 1.2 = 28 would meet the SLO with its headroom.
    assert (move.depth, move.direction) == (28, "down") and "p99 1.200 s > SLO" in move.reason
    feed(controller, clock, 28, 100.0)  # far over: at most half per step, never under 1
    depths = [28]
    for _ in range(8):
        move = controller.step(depths[-1], full_since=0.0, now=clock.now)
        depths.append(move.depth if move else depths[-1])
        feed(controller, clock, depths[-1], 100.0)
    assert depths == [28, 14, 7, 4, 2, 1, 1, 1, 1]


def test_the_depth_never_falls_below_one_query_per_instance():
    """Two CPU engines cut to depth 1 by a mix of 64-text requests left one of them idle for
    minutes, answering 5 requests a second and refusing 55."""
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0, floor=2)
    depths = [40]
    for _ in range(8):
        feed(controller, clock, depths[-1], 100.0)
        move = controller.step(depths[-1], full_since=0.0, now=clock.now)
        depths.append(move.depth if move else depths[-1])
    assert depths[-4:] == [2, 2, 2, 2] and min(depths) == 2
    assert controller.snapshot(clock.now)["holding"] == "at the bound of its range [2, 80]"


def test_a_pool_of_several_instances_has_them_as_its_floor():
    from queue_manager.manager import QueueManager
    from tests.queue_manager.doubles import InstantInstance

    qm = QueueManager([("cpu", 8, [InstantInstance("a"), InstantInstance("b")])], slo=1.0)
    assert qm.pools[0].control.floor == 2


def test_the_depth_rises_in_bounded_steps_only_where_the_pool_was_full_and_never_past_the_cap():
    clock = Clock()
    controller = DepthController(SETTINGS, seed=10, now=0.0)  # ceiling 20
    depth = 10
    feed(controller, clock, depth, 0.1)
    assert controller.step(depth, full_since=None, now=clock.now) is None  # room to spare: no evidence
    seen, rises = [], [0.0]
    for _ in range(200):
        move = controller.step(depth, full_since=0.0, now=clock.now)
        if move:
            assert move.direction == "up" and move.depth <= max(depth + 1, int(depth * 1.1))
            # A rise waits for answers admitted at least an SLO after the last move (the early
            # answers at a new depth are its fast ones).
            assert clock.now - rises[-1] >= SETTINGS.slo
            rises.append(clock.now)
            depth = move.depth
        seen.append(depth)
        feed(controller, clock, depth, 0.1)
    assert seen[-1] == 20 == controller.ceiling


def test_only_answers_admitted_since_the_pool_filled_vouch_for_a_rise():
    # 36 clients at depth 40: comfortable answers, but none of them had 40 queries ahead. When more
    # clients come and fill the pool, those answers say nothing of the depth they now meet.
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0)
    feed(controller, clock, 36, 0.3, count=400)
    clock.now += SETTINGS.slo
    filled = clock.now
    assert controller.step(40, full_since=filled, now=clock.now) is None
    holding = controller.snapshot(clock.now)["holding"]
    assert holding == "0 answers admitted at depth 40 since the pool filled, an SLO ago; 10 vouch"
    feed(controller, clock, 40, 0.3, count=10)  # admitted once it was full, answered within the headroom
    clock.now += SETTINGS.slo
    assert controller.step(40, full_since=filled, now=clock.now).direction == "up"


def test_a_cut_is_not_undone_by_the_first_fast_answers_after_it():
    # After a cut, the requests admitted since and already answered are the fast ones: a rise
    # judged on them alone would undo the cut while the tail is still over the SLO.
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0)
    feed(controller, clock, 40, 1.2)
    cut = controller.step(40, full_since=0.0, now=clock.now)
    assert cut.direction == "down"
    for _ in range(5):  # fast answers of requests admitted just now
        feed(controller, clock, cut.depth, 0.05)
        assert controller.step(cut.depth, full_since=0.0, now=clock.now) is None


def test_a_step_waits_for_answers_admitted_at_the_depth_in_force():
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0)
    feed(controller, clock, 40, 2.0)
    assert controller.step(40, full_since=0.0, now=clock.now).depth < 40
    # The answers of requests admitted before the cut say nothing of the new depth: no second cut.
    for _ in range(10):
        controller.observe(40, 2.0, admitted=clock.now - 3.0, now=clock.now)
    assert controller.step(20, full_since=0.0, now=clock.now + 0.5) is None
    feed(controller, clock, 9, 1.0, count=5)  # fewer than min_samples
    assert controller.step(20, full_since=0.0, now=clock.now) is None


def test_requests_still_running_past_the_slo_count_in_the_tail_at_their_age():
    # The answers so far are comfortable, but requests admitted with them are still running an
    # SLO later: they will miss the SLO, and a tail that leaves them out would raise the depth.
    def stepped(answers: int, overdue: list[tuple[float, int]]):
        clock = Clock()
        controller = DepthController(SETTINGS, seed=40, now=0.0)
        feed(controller, clock, 40, 0.3, count=answers)
        clock.now += SETTINGS.slo  # 1.3 s after they were admitted
        return controller.step(40, full_since=0.0, now=clock.now, overdue=overdue)

    assert stepped(400, []).direction == "up"
    # 1 in 401, each 1.3 s old so far: inside the p99, no cut; but 401 answers cannot rule out
    # that the true p99 is as slow as it (p99_upper_bound), so no rise either.
    assert stepped(400, [(0.0, 40)]) is None
    cut = stepped(100, [(0.0, 40), (0.0, 40)])  # 2 in 102: the p99
    assert cut.direction == "down" and "p99 1.300 s > SLO" in cut.reason


def test_a_rise_needs_the_tails_upper_bound_inside_the_headroom():
    # 1 % of the answers at 0.9 s and the rest at 0.4 s: the p99 is at the edge of the headroom
    # (0.85 s), but the p99 of a few hundred such answers is a fast one.
    def stepped(fast: int, slow: int):
        clock = Clock()
        controller = DepthController(SETTINGS, seed=40, now=0.0)
        for seconds, count in ((0.4, fast), (0.9, slow)):
            for _ in range(count):
                controller.observe(40, seconds, admitted=0.0, now=seconds)
        clock.now = 0.9 + SETTINGS.slo
        assert p99([0.4] * fast + [0.9] * slow) == 0.4  # what the p99 alone would rise on
        return controller.step(40, full_since=0.0, now=clock.now)

    assert stepped(fast=396, slow=4) is None
    assert stepped(fast=990, slow=10) is None  # more answers, the same tail: still no
    rise = stepped(fast=996, slow=4)  # 0.4 % slow, and answers enough to say so
    assert rise.direction == "up" and rise.depth == 44 and "95 % confidence" in rise.reason


def test_every_depth_since_the_last_fall_vouches_for_a_rise_in_proportion_to_it():
    # A full pool answering 66 queries a second: 0.015 s per unit of depth, whose tail would meet
    # the headroom at 0.85 / 0.015 = 56. Each request's in-flight count at admission swings by a
    # batch (16) below the depth, its time does not.
    def answered(controller: DepthController, depth: int, count: int, admitted: float) -> None:
        seconds = 0.015 * depth
        for i in range(count):
            controller.observe(depth - 16 * (i % 2), seconds, admitted=admitted, now=admitted + seconds)

    controller = DepthController(SETTINGS, seed=60, now=0.0)
    answered(controller, 36, 300, admitted=0.0)
    risen_at = 0.54 + SETTINGS.slo
    first = controller.step(36, full_since=0.0, now=risen_at)
    assert (first.direction, first.depth) == ("up", 39)
    # 150 answers at the new depth: too few to bound a p99 alone; with the 300 before, each per
    # unit of the depth it was admitted at, enough.
    answered(controller, 39, 150, admitted=risen_at)
    second = controller.step(39, full_since=0.0, now=risen_at + 0.585 + SETTINGS.slo)
    assert (second.direction, second.depth) == ("up", 42)


def test_the_snapshot_says_why_the_depth_holds():
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0)
    feed(controller, clock, 40, 0.3, count=5)
    assert controller.step(40, full_since=0.0, now=clock.now) is None
    assert controller.snapshot(clock.now)["holding"] == "5 answers at depth 40 so far; 10 judge it"
    feed(controller, clock, 40, 0.3, count=100)
    clock.now += SETTINGS.slo
    assert controller.step(40, full_since=None, now=clock.now) is None
    assert "room to spare" in controller.snapshot(clock.now)["holding"]
    assert controller.step(40, full_since=0.0, now=clock.now) is None
    holding = controller.snapshot(clock.now)["holding"]
    assert holding == "105 answers since the last fall; a 95 % bound on the p99 needs 299"
    feed(controller, clock, 40, 0.3, count=200)
    clock.now += SETTINGS.slo
    assert controller.step(40, full_since=0.0, now=clock.now).direction == "up"
    assert controller.snapshot(clock.now)["holding"] is None


@pytest.mark.parametrize("n", [50, 298, 299, 1000, 4096])
def test_the_p99s_upper_bound_is_an_order_statistic_that_holds_the_true_p99_19_times_in_20(n):
    values = list(range(1, n + 1))
    if n < 299:  # 0.99^n > 5 %: even the slowest of them may be under the true p99
        assert p99_upper_bound(values) is None
        return
    bound = p99_upper_bound(values)
    assert p99(values) <= bound <= n
    if n >= 1000:  # enough answers to bound it below their slowest
        assert bound < n
    # Over draws from a distribution whose p99 is known (the unit exponential's: ln 100), the
    # bound is at or above it in 95 % of them (0.92: three standard errors of 400 draws).
    rng = np.random.default_rng(n)
    covered = [p99_upper_bound(list(rng.exponential(size=n))) >= math.log(100) for _ in range(400)]
    assert np.mean(covered) >= 0.92


# ---- in the queue manager ---------------------------------------------------------------


async def two_pools(**kwargs) -> tuple[ControlledInstance, ControlledInstance, QueueManager, Clock]:
    clock = Clock()
    acc, cpu = ControlledInstance("acc0"), ControlledInstance("cpu0")
    pools = [("accelerator", 4, [acc]), ("cpu", 4, [cpu])]
    qm = QueueManager(pools, max_batch_size=8, slo=1.0, now=clock, control_interval=None, **kwargs)
    await qm.start()
    return acc, cpu, qm, clock


def test_a_pool_refused_for_room_that_is_promised_counts_as_full():
    # The front end's gate asks for room counting the requests it let through (promised), which
    # may reach admission after a batch has freed room: the pool then never fills to its depth,
    # and the refusal is the only sign that it lacked room.
    async def scenario():
        acc, cpu, qm, clock = await two_pools()
        accelerator, cpu_pool = qm.pools
        qm.admit(queries([1, 2, 3]))
        qm.admit(queries([4, 5]))  # the accelerator full, one on the CPU pool
        accelerator.full_since = cpu_pool.full_since = None  # as after a move
        qm.check_room(1, promised=2)  # 3 free on the CPU pool
        assert cpu_pool.full_since is None
        with pytest.raises(Busy):
            qm.check_room(1, promised=3)
        assert accelerator.full_since == cpu_pool.full_since == clock.now
        await qm.close()

    asyncio.run(scenario())


def test_a_request_remembers_each_pools_load_and_each_pool_is_charged_its_own_time():
    async def scenario():
        acc, cpu, qm, clock = await two_pools()
        first = qm.admit(queries([1]))
        await settle()  # running alone
        split = qm.admit(queries([2, 3, 4, 5]))  # 3 to the accelerator (then full), 1 to the CPU
        assert [(pool.name, load) for pool, load in split.loads] == [("accelerator", 4), ("cpu", 1)]
        await settle()
        clock.now = 0.2
        cpu.complete()
        await settle()
        clock.now = 0.5
        acc.complete()  # the batch of 1, then 2, 3, 4
        await settle()
        clock.now = 0.7
        acc.complete()
        await settle()
        await first.future
        await split.future
        qm.record_latency(split, 0.75)  # the caller's time: 0.05 s more than the queue manager's
        acc_control, cpu_control = (pool.control for pool in qm.pools)
        assert [(s.concurrency, s.seconds) for s in acc_control.recent] == [(4, 0.75)]
        # The CPU part was answered 0.5 s before the request's last: its sample is 0.25 s.
        assert [(s.concurrency, s.seconds) for s in cpu_control.recent] == [(1, pytest.approx(0.25))]
        await qm.close()

    asyncio.run(scenario())


def test_a_pool_whose_answers_stop_is_cut_once_its_requests_are_an_slo_old():
    async def scenario():
        clock = Clock()
        stuck = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 30, [stuck])], max_batch_size=8, slo=1.0, now=clock, control_interval=None,
                          depth_control="adaptive")
        await qm.start()
        pool = qm.pools[0]
        requests = [qm.admit(queries([marker])) for marker in range(25)]  # no answer comes
        await settle()
        clock.now = 0.9
        assert qm.step() == [] and pool.depth == 30  # not an SLO old yet: nothing to judge
        clock.now = 2.0
        assert pool.overdue(clock.now - 1.0) == [(0.0, load) for load in range(1, 26)]
        assert [(name, move.direction) for name, move in qm.step()] == [("cpu", "down")]
        assert "p99 2.000 s > SLO" in pool.control.reason
        while not all(request.future.done() for request in requests):
            stuck.complete()
            await settle()
        assert pool.overdue(clock.now) == [] and not pool.pending  # answered: forgotten
        await qm.close()

    asyncio.run(scenario())


def test_a_request_whose_client_left_is_neither_overdue_nor_kept():
    # A cancelled request's queued queries are dropped and its answer never comes: counted as
    # overdue, it read as a request running ever longer (the wrk runs of a bench level ended with
    # some queued, and the depth was halved on a tail no client saw); kept, it held every later
    # request in `pending` with it.
    async def scenario():
        clock = Clock()
        instance = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 30, [instance])], max_batch_size=4, slo=1.0, now=clock, control_interval=None,
                          depth_control="adaptive")
        await qm.start()
        pool = qm.pools[0]
        requests = [qm.admit(queries([marker])) for marker in range(24)]
        await settle()  # markers 0-3 run as a batch; the rest wait in the queue
        for request in requests[4:]:
            qm.cancel(request)  # their clients left (as wrk's do when its run ends)
        clock.now = 1.5
        later = [qm.admit(queries([marker])) for marker in range(100, 120)]
        clock.now = 2.0
        assert pool.overdue(clock.now - 1.0) == [(0.0, load) for load in range(1, 5)]
        assert qm.step() == [] and pool.depth == 30  # 4 late requests are too few to judge; 24 cut it
        while not all(request.future.done() for request in requests[:4] + later):
            instance.complete()
            await settle()
        assert pool.overdue(clock.now) == [] and not pool.pending  # none kept, none behind a cancelled one
        await qm.close()

    asyncio.run(scenario())


def test_answered_requests_are_forgotten_even_where_no_control_step_runs():
    async def scenario():
        instance = InstantInstance("cpu0")
        qm = QueueManager([("cpu", 4, [instance])], max_batch_size=8)  # no SLO: no control loop
        await qm.start()
        pool = qm.pools[0]
        for marker in range(50):
            await qm.admit(queries([marker])).future
        assert len(pool.pending) == 1  # only the last, until the next admission looks
        await qm.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("mode", ["static", "adaptive"])
def test_only_adaptive_mode_moves_depths_and_both_show_the_live_fit(mode):
    async def scenario():
        acc, cpu, qm, clock = await two_pools(depth_control=mode)
        qm.set_depth("accelerator", 4, token_budget=400, token_charge=TokenCharge())
        pool = qm.pools[0]
        pool.full_since = clock.now
        for level in (2, 4):
            for _ in range(10):
                pool.control.observe(level, 1.5 * level, admitted=clock.now, now=clock.now)
        clock.now = 1.0
        moves = qm.step()
        snapshot = qm.snapshot()["pools"][0]
        control = snapshot["control"]
        assert control["fit"]["alpha"] == pytest.approx(1.5) and control["fit"]["beta"] == pytest.approx(0.0)
        assert control["live_p99"] == pytest.approx(6.0) and control["seed"] == 4
        if mode == "static":
            assert moves == [] and pool.depth == 4 and pool.token_budget == 400
        else:
            assert [(name, move.depth) for name, move in moves] == [("accelerator", 2)]
            assert pool.depth == 2 and pool.token_budget == 200  # the token budget follows the depth
            assert control["reason"].startswith("p99 6.000 s > SLO") and control["changed_at"] == 1.0
        names = ("windve_pool_fit_alpha_seconds", "windve_pool_fit_beta_seconds", "windve_pool_live_p99_seconds")
        gauges = {name: REGISTRY.get_sample_value(name, {"pool": "accelerator"}) for name in names}
        assert gauges == {
            "windve_pool_fit_alpha_seconds": pytest.approx(1.5),
            "windve_pool_fit_beta_seconds": pytest.approx(0.0),
            "windve_pool_live_p99_seconds": pytest.approx(6.0),
        }
        qm.set_depth("accelerator", 6)  # a new calibration: the depth restarts from it
        assert pool.depth == 6 and qm.snapshot()["pools"][0]["control"]["ceiling"] == 12
        await qm.close()

    asyncio.run(scenario())


def test_depth_changes_are_counted_by_direction_and_cause_and_the_last_one_is_shown():
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"pool": "cpu", **labels}) or 0.0

    def last_move() -> str:
        states = {state: sample("windve_pool_depth_last_move", windve_pool_depth_last_move=state) for state in CAUSES}
        (state,) = [state for state, on in states.items() if on == 1.0]
        return state

    async def scenario():
        cut = {"direction": "down", "cause": "over_slo"}
        before = sample("windve_pool_depth_changes_total", **cut)
        _, _, qm, clock = await two_pools(depth_control="adaptive")
        cpu = qm.pools[1]
        assert last_move() == "seed"
        seeded_at = sample("windve_pool_depth_last_move_timestamp_seconds")
        for _ in range(20):
            cpu.control.observe(4, 3.0, admitted=0.0, now=0.0)  # every answer over the SLO
        clock.now = 0.5
        qm.step()
        assert sample("windve_pool_depth_changes_total", **cut) - before == 1 and cpu.depth == 2
        assert last_move() == "over_slo"
        assert seeded_at <= sample("windve_pool_depth_last_move_timestamp_seconds") <= time.time()
        qm.set_depth("cpu", 3)  # a calibration arrives
        assert last_move() == "seed"
        await qm.close()

    asyncio.run(scenario())


def test_adaptive_mode_needs_the_slo():
    with pytest.raises(ValueError, match="SLO"):
        QueueManager([("cpu", 4, [ControlledInstance("cpu0")])], depth_control="adaptive")


# ---- a pool that slows down and recovers, in virtual time --------------------------------

SCENARIO = Scenario()


@pytest.fixture(scope="module", params=[SCENARIO.random_seed, 1, 2], ids=lambda seed: f"arrivals{seed}")
def adaptive(request):
    """An adaptive run of the scenario, for a few arrival sequences (each run is exact and repeatable)."""
    scenario = replace(SCENARIO, random_seed=request.param)
    return scenario, run_scenario(scenario, "adaptive")


def windows_p99(record, start: float, stop: float) -> list[float]:
    return [record.p99_answered(t, t + 1.0) for t in np.arange(start, stop, 1.0)]


def test_the_depth_falls_until_the_tail_meets_the_slo_within_10_seconds_of_a_slowdown(adaptive):
    scenario, record = adaptive
    assert max(windows_p99(record, scenario.slow_at + 10, scenario.recover_at)) <= scenario.slo
    assert record.depth_at(scenario.recover_at) < record.depth_at(scenario.slow_at)


def test_the_depth_comes_back_within_30_seconds_of_the_recovery(adaptive):
    scenario, record = adaptive
    before = record.depth_at(scenario.slow_at)
    assert record.depth_at(scenario.recover_at + 30) >= 0.8 * before
    assert max(windows_p99(record, scenario.recover_at + 10, scenario.end)) <= scenario.slo


def test_static_depths_never_move_and_miss_the_slo_while_the_pool_is_slow():
    static = run_scenario(SCENARIO, "static")
    assert {depth for _, depth in static.depths} == {SCENARIO.seed_depth}
    assert min(windows_p99(static, SCENARIO.slow_at + 10, SCENARIO.recover_at)) > SCENARIO.slo


def test_the_simulation_is_deterministic(adaptive):
    scenario, record = adaptive
    again = run_scenario(scenario, "adaptive")
    assert (again.answers, again.refused, again.depths) == (record.answers, record.refused, record.depths)


def test_answers_that_took_no_time_let_the_depth_rise_without_dividing_by_zero():
    # A virtual clock can report 0 s answers; the tail then points at the ceiling.
    clock = Clock()
    controller = DepthController(SETTINGS, seed=10, now=0.0)
    feed(controller, clock, 10, 0.0, count=300)
    clock.now += SETTINGS.slo
    move = controller.step(10, full_since=0.0, now=clock.now)
    assert move is not None and move.direction == "up" and move.depth == 11


def test_a_depth_set_under_the_floor_is_not_raised_while_its_tail_is_over_the_slo():
    """A profile sets a pool's depth to each of its levels, 1 among them, under a floor of 2: with
    its tail over the SLO the clamp to the floor made a rise 'for' over_slo, which /metrics has no
    series for, and the control step failed with a KeyError."""
    clock = Clock()
    controller = DepthController(SETTINGS, seed=40, now=0.0, floor=2)  # range [2, 80]
    feed(controller, clock, 1, 3.0)
    assert controller.step(1, full_since=0.0, now=clock.now) is None
    assert controller.snapshot(clock.now)["holding"].startswith("outside its range [2, 80]")
