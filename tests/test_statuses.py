"""The status words are StrEnums: members are the words the JSON schema lists, and they
serialize, format and compare as those words."""

from __future__ import annotations

import json

from spectool.report import schema, to_json
from spectool.statuses import OK_STATUSES, FileIntegrity, OpStatus, Status


def test_the_schema_lists_exactly_the_enum_values():
    props = schema()["properties"]
    assert props["recipes"]["items"]["properties"]["status"]["enum"] == [s.value for s in Status]
    assert props["files"]["items"]["properties"]["state"]["enum"] == [s.value for s in FileIntegrity]


def test_members_are_their_words():
    assert Status.WOULD_APPLY == "would-apply" and f"{Status.ALREADY_APPLIED}" == "already-applied"
    assert str(FileIntegrity.INTACT) == "intact" and OpStatus.SKIPPED == "skipped-by-option"
    assert Status("drift") is Status.DRIFT and Status("conflict") is Status.CONFLICT
    assert json.loads(to_json({"status": Status.UPSTREAMED, "state": FileIntegrity.MODIFIED})) == {
        "schema_version": 1,
        "state": "modified",
        "status": "upstreamed",
    }


def test_ok_statuses():
    assert (
        {s for s in Status if s.ok}
        == set(OK_STATUSES)
        == {Status.WOULD_APPLY, Status.APPLIED, Status.ALREADY_APPLIED, Status.UPSTREAMED}
    )
    assert {s for s in FileIntegrity if s.damaged} == {FileIntegrity.MODIFIED, FileIntegrity.MISSING}
