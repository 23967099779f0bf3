"""costmodel flags beside measured tables in --inputs: a flag given says what the files must not change,
but --draft-step-us was read under a file's draft-step table and --decode-ms under a pass table, silently."""

from __future__ import annotations

import json

from drafter_lab.cli import main


def test_a_draft_step_flag_prices_the_draft_over_a_files_tables(tmp_path, capsys):
    bench = tmp_path / "forward.json"
    bench.write_text(json.dumps({"draft_step_us": 700.0, "draft_step_us_by_batch": {"1": 700.0, "8": 980.0},
                                 "draft_extend_us_by_batch": {"1": 900.0}}))
    flagged = tmp_path / "flagged.json"
    assert main(["costmodel", "--inputs", str(bench), "--draft-step-us", "100", "--json", str(flagged)]) == 0
    plain = tmp_path / "plain.json"
    assert main(["costmodel", "--draft-step-us", "100", "--json", str(plain)]) == 0
    capsys.readouterr()
    a, b = json.loads(flagged.read_text()), json.loads(plain.read_text())
    assert a["cycle_ms"] == b["cycle_ms"] and a["spec_tok_s"] == b["spec_tok_s"]


def test_a_decode_flag_beside_a_pass_table_is_refused(tmp_path, capsys):
    passes = tmp_path / "verify.json"
    passes.write_text(json.dumps({"decode_ms": 10.0, "verify_ms_by_tokens": {"1": {"1": 10.0, "4": 12.0}}}))
    assert main(["costmodel", "--inputs", str(passes), "--decode-ms", "20"]) == 2
    assert "--decode-ms does not apply beside a `bench verify` pass table" in capsys.readouterr().err
