"""`drafter-lab eval` and `evaluate`: numbers, the lossless check, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import shutil
import statistics

import pytest
import torch

from drafter_lab.cli import main
from drafter_lab.drafter.checkpoint import save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.spec import engine as engine_module
from drafter_lab.spec import eval as spec_eval
from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.eval import evaluate
from drafter_lab.targets.fingerprint import legacy_fingerprint
from drafter_lab.targets.hf import default_aux_layer_ids

from .conftest import late_tokens


def test_evaluate_numbers(target, trained_drafter, conversations):
    r = evaluate(target, trained_drafter, conversations[:4], steps=4, topk=1, batch=2, max_new_tokens=24)
    assert r["served_accept_len"] > 2.0
    assert "served" in r["accept_length_kind"] and "bonus" in r["accept_length_kind"]
    hist = r["accept_histogram"]
    assert sorted(hist) == ["1", "2", "3", "4", "5"]
    assert sum(hist.values()) == r["verify_steps"]
    assert sum(int(k) * n for k, n in hist.items()) / r["verify_steps"] == pytest.approx(r["served_accept_len"])
    assert r["spec_tokens"] == r["baseline_tokens"] == 4 * 24
    assert r["decode_passes"] == 2 * 23  # two batches; each row's first token comes from the prefill
    assert r["speedup"] == pytest.approx(r["spec_tok_s"] / r["baseline_tok_s"])
    assert r["lossless_check"] == "identical"
    assert r["config"]["drafting"] == "chain"
    # The wall time split by phase: every phase ran, and together they are (almost all of) each decode's time.
    spec, base = r["phase_seconds"]["spec"], r["phase_seconds"]["baseline"]
    assert list(spec) == ["prefill", "draft", "verify", "accept", "extend"] and min(spec.values()) > 0
    assert list(base) == ["prefill", "verify", "accept"] and min(base.values()) > 0
    assert 0.8 * r["spec_seconds"] < sum(spec.values()) <= r["spec_seconds"]
    assert 0.8 * r["baseline_seconds"] < sum(base.values()) <= r["baseline_seconds"]
    # Per request: every prompt's TTFT, and its TPOT over its 23 tokens after the first; the second
    # batch waits for the first, so its TTFT counts that side's first batch too.
    for side, seconds in (("spec", r["spec_seconds"]), ("baseline", r["baseline_seconds"])):
        ttft, tpot = r["requests"][side]["ttft_ms"], r["requests"][side]["tpot_ms"]
        assert len(ttft) == len(tpot) == 4 and ttft[0] == ttft[1] < ttft[2] == ttft[3] < 1e3 * seconds
        assert all(0 < t < 1e3 * seconds / 23 for t in tpot)
    lat = r["latency"]
    assert lat["tpot_speedup"] == pytest.approx(lat["baseline"]["tpot_ms"]["median"] / lat["spec"]["tpot_ms"]["median"])


def test_latency_summary_is_median_and_nearest_rank_p90():
    spec = {"ttft_ms": [5.0], "tpot_ms": [float(x) for x in range(1, 21)]}
    base = {"ttft_ms": [4.0, 6.0], "tpot_ms": []}
    lat = spec_eval.latency(spec, base)
    assert lat["spec"] == {"ttft_ms": {"median": 5.0, "p90": 5.0}, "tpot_ms": {"median": 10.5, "p90": 18.0}}
    assert lat["baseline"] == {"ttft_ms": {"median": 5.0, "p90": 6.0}, "tpot_ms": {"median": None, "p90": None}}
    assert lat["tpot_speedup"] is None


def test_evaluate_tree_and_sampling(target, trained_drafter, conversations):
    r = evaluate(target, trained_drafter, conversations[:2], steps=3, topk=2, draft_tokens=5, batch=2,
                 max_new_tokens=16)
    assert r["config"]["drafting"] == "tree" and r["lossless_check"] == "identical"
    r = evaluate(target, trained_drafter, conversations[:2], steps=3, batch=2, max_new_tokens=16,
                 temperature=0.8, seed=1)
    assert r["lossless_check"].startswith("skipped") and r["served_accept_len"] >= 1


def test_continuous_schedule_keeps_the_batch_full(target, trained_drafter, conversations, prompts, monkeypatch):
    """Rows that end apart (eos): the continuous schedule decodes the same tokens in no more target
    passes than batch after batch, and none of its rows is a finished one riding along."""
    plain = SpecEngine(target, None, SpecConfig(max_new_tokens=24, stop_at_eos=False))
    eos = late_tokens(plain.generate(prompts, speculative=False).tokens, first=3)
    monkeypatch.setattr(engine_module, "stop_token_ids", lambda target: sorted(eos))
    runs = {continuous: evaluate(target, trained_drafter, conversations, batch=3, continuous=continuous,
                                 max_new_tokens=24) for continuous in (False, True)}
    static, cont = runs[False], runs[True]
    assert cont["config"]["schedule"] == "continuous" and static["config"]["schedule"] == "static"
    assert cont["lossless_check"] == "identical" and cont["spec_tokens"] == static["spec_tokens"] < 6 * 24
    assert cont["decode_passes"] <= static["decode_passes"]
    assert static["live_rows_per_pass"]["baseline"] < 3
    assert cont["live_rows_per_pass"]["baseline"] >= static["live_rows_per_pass"]["baseline"]
    # the speculative decode refills its slots here (a target-only one may end as late either way)
    assert cont["live_rows_per_pass"]["spec"] > static["live_rows_per_pass"]["spec"]
    assert cont["live_rows_per_pass"]["spec"] == pytest.approx(cont["verify_steps"] / cont["verify_passes"])


def test_lossless_failure_names_prompt_and_position(target, trained_drafter, conversations, monkeypatch):
    real = spec_eval.SpecEngine.generate

    def corrupt(self, prompts, *, speculative=True, **kw):
        g = real(self, prompts, speculative=speculative, **kw)
        if speculative and g.tokens[0] and len(g.tokens[0]) > 3:
            g.tokens[0][3] += 1
        return g

    monkeypatch.setattr(spec_eval.SpecEngine, "generate", corrupt)
    with pytest.raises(LabError, match=r"prompt 0 \(c0\) differs at generated token 3"):
        evaluate(target, trained_drafter, conversations[:1], max_new_tokens=8)


def test_a_decode_without_a_verify_step_is_refused(target, trained_drafter, conversations):
    """One new token comes from the prefill alone: no accept length to report (it was NaN)."""
    with pytest.raises(LabError, match="no verify step ran: .* raise --max-new-tokens"):
        evaluate(target, trained_drafter, conversations[:2], max_new_tokens=1)


def test_cli_eval(random_llama, drafter_dir, prompts_file, tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--prompts", str(prompts_file),
               "--steps", "4", "--batch", "3", "--max-new-tokens", "16", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "served accept length" in text and "tok/s" in text and "lossless check: identical" in text
    assert "speculative cycle: prefill" in text and "target-only step:  prefill" in text and "+ decode" in text
    assert "per request, ms (speculative / target only): TTFT median" in text and "faster per token" in text
    data = json.loads(out.read_text())
    assert data["served_accept_len"] > 1.5 and data["prompts"] == 6
    # The eval feeds the cost model: its histogram gives the accept length at depths 1..4.
    model = tmp_path / "cm.json"
    assert main(["costmodel", "--inputs", str(out), "--json", str(model)]) == 0
    assert "best:" in capsys.readouterr().out
    accepts = [row["accept"] for row in json.loads(model.read_text())["steps_table"]]
    assert len(accepts) == 4 and accepts == sorted(accepts) and 1 <= accepts[0]
    assert accepts[-1] == pytest.approx(data["served_accept_len"])


def test_cli_eval_reports_each_prompt_set_then_pools_them(random_llama, drafter_dir, prompts_file, tmp_path, capsys):
    lines = prompts_file.read_text().splitlines(keepends=True)
    code, more = tmp_path / "code.jsonl", tmp_path / "more.jsonl"
    code.write_text("".join(lines[:3]))
    more.write_text("".join(lines[3:]))
    argv = ["eval", "--drafter", str(drafter_dir), "--target", str(random_llama), "--steps", "4", "--batch", "3",
            "--max-new-tokens", "16"]
    assert main(argv + ["--prompts", str(code), "--prompts", str(more), "--json", str(tmp_path / "sets.json")]) == 0
    text = capsys.readouterr().out
    assert "set code: 3 prompts" in text and "set more: 3 prompts" in text and "pooled over the sets:" in text
    pooled = json.loads((tmp_path / "sets.json").read_text())
    sets = pooled["sets"]
    assert list(sets) == ["code", "more"] and pooled["prompts_file"] == [str(code), str(more)]
    assert pooled["accept_histogram"] == {k: sets["code"]["accept_histogram"][k] + sets["more"]["accept_histogram"][k]
                                          for k in pooled["accept_histogram"]}
    assert pooled["spec_tokens"] == pooled["baseline_tokens"] == 6 * 16
    assert pooled["requests"]["spec"]["tpot_ms"] == (sets["code"]["requests"]["spec"]["tpot_ms"]
                                                     + sets["more"]["requests"]["spec"]["tpot_ms"])
    assert pooled["latency"]["spec"]["tpot_ms"]["median"] == pytest.approx(
        statistics.median(pooled["requests"]["spec"]["tpot_ms"]))
    assert pooled["phase_seconds"]["spec"]["verify"] == pytest.approx(
        sets["code"]["phase_seconds"]["spec"]["verify"] + sets["more"]["phase_seconds"]["spec"]["verify"])
    # Batches of 3 never mix the two halves, so one eval of all six prompts decodes exactly the same.
    assert main(argv + ["--prompts", str(prompts_file), "--json", str(tmp_path / "all.json")]) == 0
    whole = json.loads((tmp_path / "all.json").read_text())
    assert pooled["accept_histogram"] == whole["accept_histogram"]
    assert pooled["served_accept_len"] == pytest.approx(whole["served_accept_len"])
    assert pooled["verify_steps"] == whole["verify_steps"] and pooled["lossless_check"] == "identical"


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    lines = [x for x in capsys.readouterr().err.strip().splitlines() if x.strip()]
    assert lines[-1].startswith("error: ")
    return lines[-1]


def _eval_argv(drafter, target, prompts):
    return ["eval", "--drafter", str(drafter), "--target", str(target), "--prompts", str(prompts),
            "--max-new-tokens", "4", "--max-prompts", "1"]


def _save_misfit(target, out, aux=None, **overrides):
    cfg = DrafterConfig.for_target(target.config, 64, aux or default_aux_layer_ids(target.num_layers), **overrides)
    drafter = Eagle3Drafter(cfg)
    drafter.t2d[:64] = True  # d2t's zeros map draft id i to target id i
    return save_drafter(drafter, out)


def test_drafter_that_does_not_fit(target, random_llama, prompts_file, tmp_path, capsys):
    vocab = _save_misfit(target, tmp_path / "vocab", target_vocab_size=target.vocab_size + 8)
    assert "vocab does not fit" in _cli_error(capsys, _eval_argv(vocab, random_llama, prompts_file))
    hidden = _save_misfit(target, tmp_path / "hidden", target_hidden_size=2 * target.hidden_size)
    assert "hidden size does not fit" in _cli_error(capsys, _eval_argv(hidden, random_llama, prompts_file))
    aux = _save_misfit(target, tmp_path / "aux", aux=[2, 4, target.num_layers + 3])
    assert "out of range" in _cli_error(capsys, _eval_argv(aux, random_llama, prompts_file))


def test_drafter_of_another_target(random_llama, drafter_dir, prompts_file, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(drafter_dir, other)
    (other / "run.json").write_text(json.dumps({"target": {"fingerprint": "0123456789abcdef"}}))
    msg = _cli_error(capsys, _eval_argv(other, random_llama, prompts_file))
    assert "trained on target 0123456789abcdef" in msg
    assert main(_eval_argv(other, random_llama, prompts_file) + ["--allow-other-target"]) == 0
    # trained before targets were fingerprinted by a sample of every tensor: the older name still pairs
    (other / "run.json").write_text(json.dumps({"target": {"fingerprint": legacy_fingerprint(random_llama)}}))
    assert main(_eval_argv(other, random_llama, prompts_file)) == 0


def test_bad_prompt_files(random_llama, drafter_dir, tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert "not found" in _cli_error(capsys, _eval_argv(drafter_dir, random_llama, missing))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}\n'
                      "{oops\n")
    assert "line 2 is not valid JSON" in _cli_error(capsys, _eval_argv(drafter_dir, random_llama, broken))
    no_user = tmp_path / "no_user.jsonl"
    no_user.write_text(json.dumps({"id": "s1", "conversations": [{"role": "system", "content": "be nice"},
                                                                {"role": "assistant", "content": "hello"}]}) + "\n")
    assert "s1 has no user turn" in _cli_error(capsys, _eval_argv(drafter_dir, random_llama, no_user))


@pytest.mark.parametrize("n", ["0", "-1"])
def test_max_prompts_below_one_is_refused(random_llama, drafter_dir, prompts_file, n, capsys):
    """-1 silently dropped the last prompt (a slice), 0 blamed the prompts file."""
    with pytest.raises(SystemExit) as e:
        main([*_eval_argv(drafter_dir, random_llama, prompts_file), "--max-prompts", n])
    assert e.value.code == 2 and "--max-prompts: expected a positive integer" in capsys.readouterr().err


def test_evaluate_refuses_a_misfit_object(target, trained_drafter, conversations):
    bad = Eagle3Drafter(DrafterConfig.for_target(target.config, 32, [2, 4, 5]))
    with torch.no_grad():
        bad.d2t.fill_(target.vocab_size)  # maps draft ids past the target vocab
    with pytest.raises(LabError, match="d2t maps"):
        evaluate(target, bad, conversations[:1], max_new_tokens=4)


def test_checkpoint_without_embedding_takes_the_targets(target, trained_drafter, tmp_path):
    from drafter_lab.spec.pairing import load_for_target

    d = load_for_target(save_drafter(trained_drafter, tmp_path / "noembed", embed=False), target)
    assert torch.equal(d.embed_tokens.weight, target.embed_weight())
    assert torch.equal(d.lm_head.weight, trained_drafter.lm_head.weight)
    assert torch.equal(d.d2t, trained_drafter.d2t)
