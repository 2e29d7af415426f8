"""Estimator: queue depths from short profiling runs (WindVE paper IV-B2, V-C).

Imports nothing from `windve`: a pool is "something to submit queries to", an async callable taking
one request's token-id sequences (`estimator.rounds.Submit`). Every tail is the p99 of end-to-end latency.

- rounds       the closed-loop workload (C one-query requests together, the next round after all)
- profile      geometric growth, one aimed level, the settled crossing, a bracket narrowed where the
               line missed the bend (`ProfileOptions`)
- fit          t = alpha*C + beta (alpha, beta >= 0), C_max per SLO, length-aware token budget
- stress       the stress-test baseline (fixed step)
- recheck      whether the machine kept its speed during a calibration
- layouts      keep the CPU layout with the largest CPU depth
- pipeline     all of the above for a set of pools -> Calibration
- calibration  the result, its JSON file, validation and fingerprint checks
- plot/report  the Fig. 4-like picture and the Table III-like text
- simulated    a pool with a known service time, and a virtual clock to run it on (tests, benchmark)
- http_pool    a running server as a pool (POST /embed)
- local_server a server subprocess for as long as it is profiled
"""

from estimator.calibration import (
    Calibration,
    CalibrationError,
    PoolCalibration,
    SloDepth,
    fingerprint_mismatch,
    load_calibration,
    save_calibration,
)
from estimator.fit import (
    DEFAULT_HEADROOM,
    LengthFit,
    LinearFit,
    decide_depth,
    depth_for_slo,
    fit_linear,
    token_budget_for_slo,
)
from estimator.pipeline import CalibrationOptions, CalibrationRunError, calibrate_pool, calibrate_pools
from estimator.profile import ProfileOptions, decide_profile_depth, profile_pool
from estimator.rounds import LevelSample, MakeQuery, Progress, Submit

__all__ = [
    "DEFAULT_HEADROOM",
    "Calibration",
    "CalibrationError",
    "CalibrationOptions",
    "CalibrationRunError",
    "LengthFit",
    "LevelSample",
    "LinearFit",
    "MakeQuery",
    "PoolCalibration",
    "ProfileOptions",
    "Progress",
    "SloDepth",
    "Submit",
    "calibrate_pool",
    "calibrate_pools",
    "decide_depth",
    "decide_profile_depth",
    "depth_for_slo",
    "fingerprint_mismatch",
    "fit_linear",
    "load_calibration",
    "profile_pool",
    "save_calibration",
    "token_budget_for_slo",
]
