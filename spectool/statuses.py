"""The words spectool reports: per-recipe statuses, per-operation results, per-file integrity.

Each is a ``StrEnum``: a member is its own string (``Status.DRIFT == "drift"``), so JSON
reports, the lockfile and text tables print the same words as before, and code compares
against names instead of spelling the words again. The JSON schema
(spectool/schema/report-v1.json) lists the same values.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A recipe's outcome in a plan or report."""

    WOULD_APPLY = "would-apply"  # check / dry-run: its edits are planned, nothing written
    APPLIED = "applied"  # apply wrote its edits
    ALREADY_APPLIED = "already-applied"  # every edit is in place already
    UPSTREAMED = "upstreamed"  # SGLang has the feature; the recipe has nothing to do
    DRIFT = "drift"  # an anchor no longer matches the source
    CONFLICT = "conflict"  # another recipe changed the node it edits
    UNSUPPORTED = "unsupported"  # no variant covers this SGLang release
    BLOCKED = "blocked"  # a recipe it requires did not apply
    INVALID = "invalid"  # the patched file would not compile or would use undefined names

    @property
    def ok(self) -> bool:
        """The recipe is (or would be) in place: apply and check succeed with it."""
        return self in OK_STATUSES


OK_STATUSES = frozenset({Status.WOULD_APPLY, Status.APPLIED, Status.ALREADY_APPLIED, Status.UPSTREAMED})


class OpStatus(StrEnum):
    """What one operation did to its file (``Operation.run`` returns APPLIED or ALREADY)."""

    APPLIED = "applied"  # it changed the tree
    ALREADY = "already"  # its edit was in place; nothing changed
    SKIPPED = "skipped-by-option"  # its ``when`` option is off


class FileIntegrity(StrEnum):
    """A patched file against the hashes in spectool.lock."""

    INTACT = "intact"  # as spectool wrote it
    ORIGINAL = "original"  # as it was before the apply
    MODIFIED = "modified"  # changed since spectool wrote it
    MISSING = "missing"  # gone
    REVERTED = "reverted"  # revert restored the original

    @property
    def damaged(self) -> bool:
        """Changed behind spectool's back: apply and revert refuse without --force."""
        return self in (FileIntegrity.MODIFIED, FileIntegrity.MISSING)
