"""What a release command ended with, in words: the flow's outcome (a dict) as one line a person
reads, with the release id and the publication's folder whole, so they can be pasted."""

from __future__ import annotations

UTILITY = {"released": "its utility signal released", "withheld": "its utility signal withheld",
           "not run": "its utility signal not computed"}


def outcome_line(result: dict) -> str:
    """`Release <id> published (signed): <folder>` or `Release <id> rejected: ...`; anything else as is."""
    release_id, status = result.get("release_id"), result.get("status")
    if status == "published":
        said = f"Release {release_id} published (signed): {result.get('directory')}"
        if result.get("utility") in UTILITY:
            said += f"; {UTILITY[result['utility']]}"
        return said
    if status == "rejected":
        return f"Release {release_id} rejected: nothing was published and its budget was refunded"
    return str(result)
