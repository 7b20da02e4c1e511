"""dp_core: the dprelease DP engine. No Prefect, no store: pure functions and small typed objects.

    from dp_core import Query, execute, count, avg, median
    result = execute(Query([count(), avg("age", 17, 90)], privacy_unit="person_id",
                           group_by=("education",), epsilon=1.0), "adult.csv")
    print(result)            # public view: values with confidence intervals
    result.controller_only   # partition and clamping loss: controller only, not DP
"""

from .bounds import BoundsError
from .engine import execute
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
from .result import ControllerOnly, DPResult

__all__ = [
    "Aggregate", "BoundsError", "ControllerOnly", "DPError", "DPResult", "InvalidDataError", "InvalidQueryError",
    "Query", "UnsupportedError", "avg", "count", "count_units", "execute", "max_", "median", "min_",
    "quantile", "stddev", "sum_", "var",
]
