"""dp_core: the dprelease DP engine. No Prefect, no store: pure functions and small typed objects.

    from dp_core import Query, execute, count, avg, median
    result = execute(Query([count(), avg("age", 17, 90)], privacy_unit="person_id",
                           group_by=("education",), epsilon=1.0), "adult.csv")
    print(result)            # public view: values with confidence intervals
    result.controller_only   # partition and clamping loss: controller only, not DP
"""

from .errors import DPError, InvalidDataError, InvalidQueryError, UnsupportedError
from .query import (
    Aggregate,
    Query,
    avg,
    count,
    count_units,
    max_,
    median,
    min_,
    quantile,
    stddev,
    sum_,
    var,
)

# imported on first use (PEP 562): the engine pulls in DuckDB, pandas and numpy, and `import
# dp_core` (and every CLI start) must stay fast
_LAZY = {"execute": "engine", "BoundsError": "bounds", "ControllerOnly": "result", "DPResult": "result"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dp_core' has no attribute {name!r}")

__all__ = [
    "Aggregate", "BoundsError", "ControllerOnly", "DPError", "DPResult", "InvalidDataError", "InvalidQueryError",
    "Query", "UnsupportedError", "avg", "count", "count_units", "execute", "max_", "median", "min_",
    "quantile", "stddev", "sum_", "var",
]
