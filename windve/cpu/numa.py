"""Bind a process's memory to one NUMA node with libnuma, through ctypes.

Called in a worker before torch is imported and before any weight is loaded, so every
page the worker touches first (weights, activations, its shared-memory slots) is taken
from its own node. Nothing here raises: a machine without libnuma, a kernel without NUMA
support or a node that does not exist gives a status string saying why, and the worker
runs with the default policy (reported in /info).
"""

from __future__ import annotations

import ctypes
import os

MPOL_BIND = 2
MPOL_PREFERRED = 1
_MASK_WORDS = 64  # 4096 nodes: more than any kernel allows (MAX_NUMNODES <= 1024)


def _load_libnuma() -> ctypes.CDLL:
    lib = ctypes.CDLL("libnuma.so.1", use_errno=True)
    lib.numa_available.restype = ctypes.c_int
    lib.numa_max_node.restype = ctypes.c_int
    lib.numa_allocate_nodemask.restype = ctypes.c_void_p
    lib.numa_bitmask_setbit.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.numa_bitmask_setbit.restype = ctypes.c_void_p
    lib.numa_bitmask_isbitset.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.numa_bitmask_isbitset.restype = ctypes.c_int
    lib.numa_bitmask_free.argtypes = [ctypes.c_void_p]
    lib.numa_set_membind.argtypes = [ctypes.c_void_p]
    lib.numa_set_preferred.argtypes = [ctypes.c_int]
    lib.get_mempolicy.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_ulong),
        ctypes.c_ulong,
        ctypes.c_void_p,
        ctypes.c_ulong,
    ]
    lib.get_mempolicy.restype = ctypes.c_int
    return lib


def current_policy(lib: ctypes.CDLL) -> tuple[int, set[int]]:
    """The calling thread's memory policy as (mode, nodes), read back from the kernel."""
    mode = ctypes.c_int(-1)
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    if lib.get_mempolicy(ctypes.byref(mode), mask, _MASK_WORDS * bits, None, 0) != 0:
        return -1, set()
    nodes = {word * bits + bit for word in range(_MASK_WORDS) for bit in range(bits) if mask[word] >> bit & 1}
    return mode.value, nodes


def bind_memory(node: int) -> str:
    """Bind future allocations of this process to `node`.

    Returns "bound" (strict MPOL_BIND), "preferred" (MPOL_PREFERRED: the kernel refused a
    strict bind, e.g. a cpuset without that node) or "unavailable: <reason>".
    """
    try:
        lib = _load_libnuma()
    except OSError as error:
        return f"unavailable: libnuma not loadable ({error})"
    if lib.numa_available() < 0:
        return "unavailable: the kernel has no NUMA support (numa_available() < 0)"
    max_node = lib.numa_max_node()
    if node < 0 or node > max_node or not os.path.isdir(f"/sys/devices/system/node/node{node}"):
        return f"unavailable: NUMA node {node} does not exist (highest node is {max_node})"
    allowed = ctypes.c_void_p.in_dll(lib, "numa_all_nodes_ptr")
    if not lib.numa_bitmask_isbitset(allowed, node):
        return f"unavailable: NUMA node {node} is not in this process's allowed memory nodes"
    mask = lib.numa_allocate_nodemask()
    try:
        lib.numa_bitmask_setbit(mask, node)
        lib.numa_set_membind(mask)  # void: libnuma reports failure only on stderr
    finally:
        lib.numa_bitmask_free(mask)
    mode, nodes = current_policy(lib)
    if mode == MPOL_BIND and nodes == {node}:
        return "bound"
    lib.numa_set_preferred(node)
    mode, nodes = current_policy(lib)
    if mode == MPOL_PREFERRED and node in nodes:
        return "preferred"
    return f"unavailable: neither binding nor preferring node {node} took effect (policy mode {mode})"
