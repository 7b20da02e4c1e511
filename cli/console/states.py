"""A release's state in words, the same on every page: a rejected run says Rejected, a refunded
one says what ended it and that its budget came back."""

from __future__ import annotations

LABELS = {
    "pending": "Running",
    "awaiting_approval": "Waiting for a decision",
    "approved": "Approved (publishing)",
    "published": "Published",
    "rejected": "Rejected",
    "expired": "Expired (refunded)",
    "failed": "Failed (refunded)",
}


def label(status: str) -> str:
    return LABELS.get(status, status)
