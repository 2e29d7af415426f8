"""Device detector: accelerators and CPU/NUMA topology -> an instance plan.

Imports nothing from `windve`; settings arrive as plain values.
"""

from devices.accelerators import Accelerator
from devices.errors import DeviceError, PlanError
from devices.hardware import Hardware, detect_hardware
from devices.plan import make_plan
from devices.report import render_json, render_plan, render_text, report_dict
from devices.specs import InstanceSpec, Plan, PoolSpec
from devices.topology import CpuTopology, NumaNode, read_topology

__all__ = [
    "Accelerator",
    "CpuTopology",
    "DeviceError",
    "Hardware",
    "InstanceSpec",
    "NumaNode",
    "Plan",
    "PlanError",
    "PoolSpec",
    "detect_hardware",
    "make_plan",
    "read_topology",
    "render_json",
    "render_plan",
    "render_text",
    "report_dict",
]
