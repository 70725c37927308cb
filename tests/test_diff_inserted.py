"""The diff names a volatile value that was *inserted* (a prompt that gains a timestamp at the top, the seed's
own failure mode) ``timestamp``, not ``content``; a real insertion stays ``content``."""

from __future__ import annotations

import json

import pytest

from cacheresearch.diff import main
from cacheresearch.diff.causes import classify_text

SYSTEM = "You are a careful assistant for the billing team. Answer briefly."


@pytest.mark.parametrize("a, b, cause", [
    (SYSTEM, "Current date: 2026-12-04 10:31 UTC\n" + SYSTEM, "timestamp"),
    (SYSTEM, "2026-12-04T10:31:00Z " + SYSTEM, "timestamp"),
    ("Current date: 2026-12-04\n" + SYSTEM, SYSTEM, "timestamp"),  # removed again
    ("Date: 2026-12-03. " + SYSTEM, "Date: 2026-12-04. " + SYSTEM, "timestamp"),  # changed in place, as before
    (SYSTEM, "Please be polite. " + SYSTEM, "content"),
    (SYSTEM, "A whole new paragraph of instructions that was added on 2026-12-04 by the operations team for "
             "every request of the billing queue.\n" + SYSTEM, "content"),  # long: a change of the text
])
def test_classify_text(a, b, cause):
    assert classify_text(a, b)[0] == cause


def test_diff_command_names_the_inserted_timestamp(tmp_path, capsys):
    def req(system):
        return {"model": "x", "messages": [{"role": "system", "content": system},
                                           {"role": "user", "content": "What is my balance?"}]}

    (tmp_path / "a.json").write_text(json.dumps(req(SYSTEM)))
    (tmp_path / "b.json").write_text(json.dumps(req("Current date: 2026-12-04 10:31 UTC\n" + SYSTEM)))
    assert main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) in (0, None)
    out = json.loads(capsys.readouterr().out)
    assert out["cause"] == "timestamp" and out["part"] == "system" and "inserted" in out["detail"]
    assert out["hit_tokens_lost"] > 0


def test_missing_file_is_one_line(tmp_path, capsys):
    (tmp_path / "a.json").write_text("{}")
    assert main([str(tmp_path / "a.json"), str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert "nope.json: no such file" in err and err.count("\n") == 1
