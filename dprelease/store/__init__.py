"""The store: the catalogue of registered datasets, the budget ledger and its reservations, the
releases with their decisions, and the standing policies, in one SQL database (a SQLite file by
default, PostgreSQL by URL). Reservations are taken under a lock, so however many releases run at
once a dataset's committed plus reserved budget never exceeds its cap.

`tables` holds the schema, `database` the connection and locking, `ledger` the `Store` itself;
`series` the dataset series, `people` the console's people (passkeys, enrolment links, sessions),
`analysts` who submitted an inbox request (analysts' registered keys, the console's submissions).
"""

from .database import make_engine
from .errors import BudgetExceeded, StoreError
from .ledger import CAP_TOLERANCE, Store
from .tables import (
    APPROVALS,
    DECISION_STATUSES,
    FILE_FORMATS,
    FINAL_STATUSES,
    LEDGER_STATUSES,
    RELEASE_STATUSES,
    Controller,
    Dataset,
    Lease,
    LedgerEntry,
    Policy,
    Release,
    utcnow,
)

__all__ = [
    "APPROVALS", "CAP_TOLERANCE", "DECISION_STATUSES", "FILE_FORMATS", "FINAL_STATUSES", "LEDGER_STATUSES",
    "RELEASE_STATUSES", "BudgetExceeded", "Controller", "Dataset", "Lease", "LedgerEntry", "Policy", "Release", "Store",
    "StoreError", "make_engine", "utcnow",
]
