"""Mutation audit (review s76, h6) of the probe's pure parts: the reuse line (inclusive, over a home accept
that may be 1.0 but not 0), a CKA printed on its side of a line too fine for 16 decimals, aux CKA paired
layer by layer, and the sequences the source target can read; the result records a source target and
val data only where given, a pilot of one step runs (the transfer at the full rate unless told), and a
source target too shallow for the features' aux layers is refused by name."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from drafter_lab.data.shards import Sequence
from drafter_lab.errors import LabError
from drafter_lab.experiments import probe as probe_mod
from drafter_lab.experiments.config import ProbeConfig, ProbeThresholds
from drafter_lab.experiments.probe import _in_source_tokens, aux_cka, decide, probe
from drafter_lab.targets.drift import linear_cka


def test_the_reuse_line_is_inclusive_and_its_reason_gives_the_ratio():
    th = ProbeThresholds()
    assert decide(1.8, 2.0, None, th) == (
        "reuse as is", "zero-shot accept 1.80 keeps 90% of home accept 2.00 (>= 80%)")
    assert decide(0.8 * 2.0, 2.0, None, th)[0] == "reuse as is"  # exactly on the line
    assert decide(1.0, 1.0, None, th)[0] == "reuse as is"  # a home accept of 1.0 is a figure like any other


def test_a_home_accept_of_zero_is_no_basis_for_reuse():
    # every zero-shot figure is >= 0.8 x 0: reusing on it would divide by zero in the reason
    verdict, reason = decide(0.0, 0.0, None, ProbeThresholds())
    assert verdict == "train from scratch" and reason.startswith("no source target given")


def test_a_cka_too_close_to_a_fine_line_for_16_decimals_prints_in_full():
    # 1e-17 reads as 0.0000000000000000 at 16 decimals, under the line it sits on
    th = ProbeThresholds(transfer_min_cka=1e-17)
    verdict, reason = decide(1.0, 2.0, [1e-17, 0.5, 0.5], th)
    assert verdict == "transfer with remap" and "min CKA 1e-17 >= 1e-17" in reason


def test_a_steady_pilot_lead_at_the_full_rate_carries_no_caution():
    curve = [{"step": s, "scratch_cond_acc_0": 0.3, "transfer_cond_acc_0": 0.3 + x} for s, x in ((0, 0), (10, 0.2),
                                                                                                  (20, 0.2))]
    verdict, reason = decide(1.0, 2.0, None, ProbeThresholds(), {"steps": 20, "curve": curve, "gain": 0.2})
    assert verdict == "transfer with remap" and reason.endswith("points at steps 10 / 20 (>= 1 at the end)")


def _seq(aux: torch.Tensor, ids=None, name="s") -> Sequence:
    n = aux.shape[0]
    ids = torch.arange(n) if ids is None else ids
    return Sequence(seq_id=name, input_ids=ids, loss_mask=torch.ones(n, dtype=torch.bool), aux_hidden=aux,
                    final_hidden=torch.zeros(n, 1))


def test_aux_cka_pairs_each_aux_layer_of_one_target_with_the_same_layer_of_the_other():
    """Two targets of other widths (4 and 6 per layer): layer i of one against layer i of the other, over
    every token of both sequences."""
    g = torch.Generator().manual_seed(1)
    a = [torch.randn(n, 12, generator=g) for n in (30, 20)]
    mix = torch.linalg.qr(torch.randn(6, 4, generator=g)).Q.T  # orthonormal rows: keeps every inner product
    # layer 0: a rotation of the source's into 6 dims (CKA 1); layer 1: unrelated; layer 2: the source's layer 0
    b = [torch.cat([x[:, 0:4] @ mix, torch.randn(x.shape[0], 6, generator=g), x[:, 0:4] @ mix], -1) for x in a]
    got = aux_cka([_seq(x) for x in a], [_seq(x) for x in b], 3, 50)
    xa, xb = torch.cat(a), torch.cat(b)
    want = [linear_cka(xa[:, 4 * i:4 * (i + 1)], xb[:, 6 * i:6 * (i + 1)]) for i in range(3)]
    assert all(math.isclose(x, y, rel_tol=1e-5) for x, y in zip(got, want)), (got, want)
    assert got[0] > 0.99 and got[1] < 0.9 and got[2] < 0.9
    # a sample of the tokens: the same tokens of both sets, so a perfect match stays perfect
    assert math.isclose(aux_cka([_seq(x) for x in a], [_seq(x) for x in a], 3, 16)[1], 1.0, rel_tol=1e-5)


def test_the_source_reads_the_sequences_its_vocabulary_spells_wholly():
    a, b, c = (_seq(torch.zeros(3, 3), torch.tensor(ids), name) for ids, name in (([0, 1, 2], "a"), ([2, 3, 1], "b"),
                                                                                  ([1, 0, 0], "c")))
    theirs, ours = _in_source_tokens([a, b], None)
    assert theirs is ours and [s.seq_id for s in ours] == ["a", "b"]
    tokens = torch.tensor([5, 0, 7, -1])  # id 3 has no token in the source's vocabulary; id 1 is its id 0
    theirs, ours = _in_source_tokens([a, b, c], tokens)
    assert [s.seq_id for s in ours] == ["a", "c"] and ours[0] is a
    assert [s.input_ids.tolist() for s in theirs] == [[5, 0, 7], [0, 5, 5]]
    assert [s.seq_id for s in theirs] == ["a", "c"]


QUICK = ProbeConfig(max_sequences=4, pilot_steps=0, cka_tokens=32, ttt_steps=2)


def test_the_result_records_a_source_target_and_val_data_only_where_given(source, random_llama, features):
    alone = probe(source, random_llama, features, cfg=QUICK)
    assert alone["source_target"] is None and alone["val_data"] is None and alone["home"] is None
    th = ProbeThresholds(reuse_fraction=0.5)
    paired = probe(source, random_llama, features, str(random_llama), cfg=QUICK, thresholds=th)
    assert paired["source_target"] == str(random_llama) and paired["home"] is not None
    assert paired["thresholds"] == dataclasses.asdict(th)
    # one CKA per aux layer; the source target is the new one, so each layer matches itself
    assert len(paired["aux_cka"]) == 3 and all(c > 0.99 for c in paired["aux_cka"]), paired["aux_cka"]


class _Piloted(Exception):
    pass


def test_a_pilot_of_one_step_runs_and_the_defaults_train_the_transfer_at_the_full_rate(source, random_llama, features, monkeypatch):
    def fake_pilot(drafter_dir, target_dir, data_dir, recipe, pilot_dir, transfer_lr_scale, *rest):
        raise _Piloted(f"{recipe.max_steps} steps at {transfer_lr_scale}x")

    monkeypatch.setattr(probe_mod, "run_pilot", fake_pilot)
    with pytest.raises(_Piloted, match=r"^1 steps at 1.0x$"):
        probe(source, random_llama, features, cfg=dataclasses.replace(QUICK, pilot_steps=1))
    with pytest.raises(_Piloted, match=r"^48 steps at 1.0x$"):  # no cfg: ProbeConfig()'s pilot
        probe(source, random_llama, features)


def test_a_source_target_too_shallow_for_the_features_aux_layers_is_one_line(source, random_llama, features,
                                                                            tmp_path):
    """A drafter that records no aux layers is measured at home on the features' (2, 4, 5): a 4-layer
    source target has no layer 4 or 5, said before its forward pass."""
    from transformers import AutoConfig, LlamaForCausalLM

    bare = tmp_path / "bare"
    shutil.copytree(source, bare, ignore=shutil.ignore_patterns("run.json"))  # no record: taken as given
    cfg = json.loads((bare / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg.get("eagle_config", {}).pop("eagle_aux_hidden_state_layer_ids", None)
    (bare / "config.json").write_text(json.dumps(cfg))
    shallow = tmp_path / "shallow"
    config = AutoConfig.from_pretrained(str(random_llama))
    config.num_hidden_layers = 4
    LlamaForCausalLM(config).save_pretrained(shallow)
    for f in random_llama.glob("*"):
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, shallow / f.name)
    with pytest.raises(LabError, match=rf"aux layer id\(s\) \[4, 5\] out of range.*\(--source-target {shallow}\)$"):
        probe(bare, random_llama, features, shallow, cfg=QUICK)


def test_features_of_another_target_are_refused_before_the_drafter_is_read(random_llama, wide_llama, features,
                                                                          tmp_path):
    with pytest.raises(LabError, match="features were captured from target .*, not from "):
        probe(tmp_path / "no-drafter", wide_llama, features, cfg=QUICK)
