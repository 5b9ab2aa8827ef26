"""The operation kinds a recipe may use, by name. One general mechanism each.

A new kind subclasses ``Operation`` (spectool/ops/base.py: its docstring is the contract) and
is listed in OPERATIONS below.
"""

from .base import ALREADY, APPLIED, FileState, OpContext, Operation, Target
from .expressions import ReplaceExpression, WrapExpression
from .imports import AddImport, add_import
from .members import AddDefinition, AddField, AddMethod, ReplaceMethod
from .statements import AddArgument, InsertAfter, InsertBefore

OPERATIONS: dict[str, type[Operation]] = {
    cls.kind: cls
    for cls in (
        AddMethod,
        ReplaceMethod,
        AddField,
        AddDefinition,
        InsertBefore,
        InsertAfter,
        AddArgument,
        ReplaceExpression,
        WrapExpression,
        AddImport,
    )
}

__all__ = ["OPERATIONS", "ALREADY", "APPLIED", "FileState", "OpContext", "Operation", "Target", "add_import"]
