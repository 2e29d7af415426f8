"""Estimator: queue depths from short profiling runs (WindVE paper IV-B2, V-C).

Imports nothing from `windve`: a pool is "something to submit queries to", an async
callable taking one request's token-id sequences (see `estimator.rounds.Submit`).

- rounds      the closed-loop workload (C one-query requests together, next round after all)
- profile     scouted (`windve calibrate`'s default) or doubling levels, then aimed ones, until p95 passes the SLO,
              then the fitted crossing
- fit         t = alpha*C + beta (alpha, beta >= 0), C_max per SLO, length-aware token budget
- stress      stress-test baseline (fixed step) and fine-tuning with all pools loaded
- layouts     keep the CPU layout with the largest CPU depth
- pipeline    all of the above for a set of pools -> Calibration
- calibration the result, its JSON file, validation and fingerprint checks
- plot/report the Fig. 4-like picture and the Table III-like text
- simulated   a pool with a known service time (tests, benchmark)
- http_pool   a running server as a pool (POST /embed)
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
from estimator.pipeline import CalibrationOptions, CalibrationRunError, calibrate_pools
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
    "Progress",
    "SloDepth",
    "Submit",
    "calibrate_pools",
    "decide_depth",
    "depth_for_slo",
    "fingerprint_mismatch",
    "fit_linear",
    "load_calibration",
    "save_calibration",
    "token_budget_for_slo",
]
