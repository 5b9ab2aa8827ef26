"""Errors that reach the user as one paragraph and an exit code, never a traceback."""

from __future__ import annotations

# Exit codes, pre-commit style: 0 ok, 1 the check failed (drift, conflict, mismatch),
# 2 usage or bad input, 3 an internal error (a bug in spectool).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


class SpectoolError(Exception):
    """Base class: a message for the user and the exit code it maps to."""

    exit_code = EXIT_INTERNAL
    kind = "internal"

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message, **self.details}


class BadInputError(SpectoolError):
    """The user gave us something we cannot work with (path, version, flag)."""

    exit_code = EXIT_BAD_INPUT
    kind = "bad-input"


class RecipeError(BadInputError):
    """A recipe file breaks the schema or names code that does not exist."""

    kind = "recipe"


class SourceError(BadInputError):
    """The directory is not an SGLang tree, or its state is not what we expect."""

    kind = "source"


class FetchError(BadInputError):
    kind = "fetch"


class DriftError(SpectoolError):
    """An anchor of a recipe no longer matches the SGLang source."""

    exit_code = EXIT_FAILED
    kind = "drift"

    def __init__(self, message: str, *, candidates: list[str] | None = None, **details):
        super().__init__(message, **details)
        self.candidates = candidates or []

    def to_json(self) -> dict:
        return {**super().to_json(), "candidates": self.candidates}


class ConflictError(DriftError):
    """Two recipes touch the same node."""

    kind = "conflict"


class ValidationError(SpectoolError):
    """The patched source does not compile or uses names it does not define."""

    exit_code = EXIT_FAILED
    kind = "validation"
