"""How many front-end processes `windve serve` starts on fixture machines, from the plan's cores.

With an accelerator the host path (HTTP, tokenizing) is what limits the device, so the service
keeps most cores and runs one front end per service core but one (the dispatcher's), up to the
number one dispatcher can feed; without one, a single front end is fastest."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from devices import Accelerator, make_plan
from devices.cpulist import format_cpulist
from windve.commands.serve import MAX_AUTO_WORKERS, front_end_processes

V100 = Accelerator("cuda", 0, "Tesla V100-SXM2-32GB", 32 * 2**30)


def _sizing(plan, http_workers=None) -> tuple[int, str]:
    workers, cores = front_end_processes(SimpleNamespace(http_workers=http_workers), plan)
    return workers, format_cpulist(cores)


def test_a_single_node_gpu_host_keeps_three_quarters_of_its_cores_for_the_host_path(hardware_for) -> None:
    # The 16-CPU, one-node shape of the H100/H200 hosts in bench/SERVED.md.
    plan = make_plan(hardware_for("gapped", (V100,), allowed="0-15"), heterogeneous=True)
    assert format_cpulist(plan.reserved_cores) == "0-11"
    (accelerator,) = plan.pools[0].instances
    assert accelerator.cores == (11,)  # the feeding core is a service core no front end takes
    assert format_cpulist(plan.pools[1].instances[0].cores) == "12-15"
    assert _sizing(plan) == (10, "0-10")  # one core left to the dispatcher


def test_without_a_cpu_pool_front_ends_stop_at_what_one_dispatcher_feeds(hardware_for) -> None:
    plan = make_plan(hardware_for("gapped", (V100,), allowed="0-15"), heterogeneous=False)
    assert _sizing(plan) == (MAX_AUTO_WORKERS, "0-14")
    two_sockets = make_plan(hardware_for("xeon2s", (V100,)), heterogeneous=True)
    assert _sizing(two_sockets)[0] == MAX_AUTO_WORKERS  # node 0's 24 CPUs are reserved


@pytest.mark.parametrize("allowed", ["0-1", "0-3"])
def test_a_small_gpu_host_still_runs_one_front_end(hardware_for, allowed) -> None:
    plan = make_plan(hardware_for("xeon2s", (V100,), allowed=allowed), heterogeneous=True)
    assert _sizing(plan)[0] == 1  # 1 or 2 service cores: the dispatcher's, and the feeding one


def test_cpu_only_runs_one_front_end_and_a_setting_overrides_the_count(hardware_for) -> None:
    plan = make_plan(hardware_for("gapped", allowed="0-15"))
    assert _sizing(plan)[0] == 1
    assert _sizing(plan, http_workers=3)[0] == 3
