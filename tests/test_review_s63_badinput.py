"""Review s63, bad input to the commands that read a target or a drafter (eval, export, probe, bench verify):
a target whose weight files lack a tensor, hold one at another shape, or whose shard index is broken or names
a lost shard is refused by name (transformers filled the tensor with random values and went on, or said only
"see the report above" or "'weight_map'"); a tokenizer without its vocabulary file says so; a quantized drafter
(FP8, ModelOpt, GPTQ) is one line, not torch's "isfinite not implemented" traceback; a drafter saved under a
wrapper's prefix says so; a chat template's refusal in eval names the prompts file and conversation; a
hand-edited ttt_steps in run.json does not reach the speculators config."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafter_lab.cli import main
from drafter_lab.drafter.checkpoint import read_checkpoint, save_drafter
from drafter_lab.drafter.config import DrafterConfig
from drafter_lab.drafter.model import Eagle3Drafter
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target


def _rewrite(path, fn, config=None):
    """`path`'s model.safetensors through `fn` (and its config.json through `config`)."""
    f = path / "model.safetensors"
    save_file(fn(load_file(str(f))), str(f), metadata={"format": "pt"})
    if config is not None:
        data = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(config(data)))


@pytest.fixture
def target_copy(random_llama, tmp_path):
    return shutil.copytree(random_llama, tmp_path / "target")


def test_a_target_missing_a_weight_is_refused_by_name(target_copy, capsys):
    """Was exit 0: transformers filled the lost tensor with random values and the eval decoded with it."""
    name = "model.layers.3.mlp.up_proj.weight"
    _rewrite(target_copy, lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(LabError) as e:
        load_target(target_copy, tokenizer=False)
    assert str(e.value) == (f"{target_copy}: the weight files lack {name}, which transformers would fill with random "
                            "values (a partial download, or tensors under other names?)")
    assert main(["bench", "verify", "--target", str(target_copy), "--reps", "1", "--warmup", "0", "--tokens", "2",
                 "--batch", "1", "--threads", "1", "--json", str(target_copy.parent / "b.json")]) == 2
    assert name in capsys.readouterr().err
    assert not (target_copy.parent / "b.json").exists()


def test_a_target_under_other_tensor_names_is_refused(target_copy):
    _rewrite(target_copy, lambda t: {k.replace("model.", "transformer.", 1): v for k, v in t.items()})
    with pytest.raises(LabError, match=r"the weight files lack model\.\S+ and \d+ more"):
        load_target(target_copy, tokenizer=False)


def test_a_target_tensor_of_another_shape_is_named(target_copy):
    """Was "cannot load model: You set `ignore_mismatched_sizes` to `False` ... look at the above report!"."""
    name = "model.layers.0.self_attn.q_proj.weight"
    _rewrite(target_copy, lambda t: {**t, name: t[name][:10].contiguous()})
    with pytest.raises(LabError) as e:
        load_target(target_copy, tokenizer=False)
    hidden = json.loads((target_copy / "config.json").read_text())["hidden_size"]
    assert str(e.value) == (f"{target_copy}: tensor {name} has shape (10, {hidden}) in the weight files, config.json "
                            f"gives ({hidden}, {hidden})")


def test_a_target_with_an_extra_tensor_still_loads(target_copy):
    """Tensors the model does not use (an MTP layer, say) are left alone, as transformers leaves them."""
    _rewrite(target_copy, lambda t: {**t, "model.layers.99.mlp.up_proj.weight": torch.ones(2)})
    assert load_target(target_copy, tokenizer=False).num_layers == 8


@pytest.fixture
def drafter_dir(tmp_path):
    torch.manual_seed(3)
    cfg = DrafterConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        draft_vocab_size=16, target_vocab_size=64, target_hidden_size=32, aux_layer_ids=[2, 4, 5])
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():  # d2t and t2d of a draft vocabulary: the first 16 target ids
        drafter.t2d[:16] = True
    return save_drafter(drafter, tmp_path / "drafter")


def test_an_fp8_drafter_weight_is_one_line(drafter_dir, capsys):
    """Was a traceback: NotImplementedError: "isfinite" not implemented for 'Float8_e4m3fn'."""
    _rewrite(drafter_dir, lambda t: {**t, "lm_head.weight": t["lm_head.weight"].to(torch.float8_e4m3fn)})
    out = drafter_dir.parent / "out"
    assert main(["export", "--drafter", str(drafter_dir), "--format", "speculators", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {drafter_dir / 'model.safetensors'}: tensor 'lm_head.weight' is float8_e4m3fn: a quantized "
                   "drafter, which the lab does not dequantize; give its bf16, fp16 or fp32 checkpoint\n")
    assert not out.exists()


def test_a_quantized_drafter_is_named_as_one_not_as_a_foreign_tensor(drafter_dir):
    """ModelOpt's FP8 layout: FP8 projections with weight and input scales, and a quantization_config. Was
    "tensor 'midlayer.mlp.down_proj.input_scale' is not part of a Llama EAGLE-3 midlayer"."""
    def quantize(t):
        out = dict(t)
        for k, v in t.items():
            if k.startswith("midlayer.") and k.endswith("proj.weight"):
                out[k] = v.to(torch.float8_e4m3fn)
                out[k + "_scale"] = torch.tensor(0.01)
                out[k.removesuffix("weight") + "input_scale"] = torch.tensor(0.02)
        return out

    _rewrite(drafter_dir, quantize, lambda c: {**c, "quantization_config": {"quant_method": "modelopt"}})
    with pytest.raises(LabError) as e:
        read_checkpoint(drafter_dir)
    assert str(e.value) == (f"{drafter_dir / 'model.safetensors'}: tensor 'midlayer.mlp.down_proj.input_scale' belongs "
                            "to a quantized layer: a quantized drafter (modelopt), which the lab does not dequantize; "
                            "give its bf16, fp16 or fp32 checkpoint")


def test_a_bf16_drafter_still_reads(drafter_dir):
    _rewrite(drafter_dir, lambda t: {k: v.bfloat16() if v.is_floating_point() else v for k, v in t.items()})
    assert read_checkpoint(drafter_dir).tensors["fc.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.", "draft_model."])
def test_a_drafter_saved_under_a_wrapper_prefix_says_so(drafter_dir, prefix):
    """A state dict of the DDP, torch.compile or training wrapper: was "lacks tensor 'fc.weight'" alone, as if
    the file had no fc."""
    _rewrite(drafter_dir, lambda t: {prefix + k: v for k, v in t.items()})
    with pytest.raises(LabError) as e:
        read_checkpoint(drafter_dir)
    assert str(e.value).endswith(f"checkpoint lacks tensor 'fc.weight' (it holds '{prefix}fc.weight': save the "
                                 f"drafter's own state dict, without the '{prefix}' prefix)")


def test_a_chat_template_refusal_in_eval_names_the_file_and_conversation(random_llama, tmp_path):
    """Was "error: chat template rejects the conversation: ..." alone: which prompts file, which conversation?"""
    from drafter_lab.data.conversations import Conversation
    from drafter_lab.spec.eval import render_prompts
    from drafter_lab.targets.hf import load_tokenizer

    tok = load_tokenizer(random_llama)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    conv = Conversation(id="c7", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(LabError) as e:
        render_prompts(tok, [conv], tmp_path / "prompts.jsonl")
    assert str(e.value) == (f"{tmp_path / 'prompts.jsonl'}: conversation c7: chat template rejects the conversation: "
                            f"roles must alternate (the chat template of {tok.name_or_path})")


def test_a_tokenizer_without_its_vocabulary_file_says_so(target_copy):
    """Only tokenizer_config.json downloaded: was transformers' "Couldn't instantiate the backend tokenizer ...
    You need to have sentencepiece or tiktoken installed", which installing them does not cure."""
    from drafter_lab.targets.hf import load_tokenizer

    (target_copy / "tokenizer.json").unlink()
    assert (target_copy / "tokenizer_config.json").is_file()
    with pytest.raises(LabError) as e:
        load_tokenizer(target_copy)
    assert str(e.value) == (f"{target_copy}: cannot load tokenizer: no tokenizer.json (nor tokenizer.model, vocab.json "
                            "or another vocabulary file) beside its tokenizer_config.json: a partial download?")


@pytest.fixture
def sharded_target(random_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    out = shutil.copytree(random_llama, tmp_path / "sharded", ignore=shutil.ignore_patterns("model.safetensors"))
    AutoModelForCausalLM.from_pretrained(random_llama).save_pretrained(out, max_shard_size="200KB")
    assert len(list(out.glob("model-*.safetensors"))) > 2
    return out


def test_a_sharded_target_with_a_broken_index_or_a_lost_shard_names_it(sharded_target):
    """Was "cannot load model: 'weight_map'" (or "list indices must be integers") for the index, and for an
    index that no longer names a shard's tensors, a model with random weights where they were."""
    index = sharded_target / "model.safetensors.index.json"
    whole = json.loads(index.read_text())
    weight_map = whole["weight_map"]
    index.write_text(json.dumps({"metadata": whole["metadata"]}))
    with pytest.raises(LabError) as e:
        load_target(sharded_target, tokenizer=False)
    assert str(e.value) == f"{index}: not a shard index (an object whose weight_map names a file per tensor)"
    lost = sorted(weight_map.items())[0]
    index.write_text(json.dumps({**whole, "weight_map": {k: v for k, v in weight_map.items() if k != lost[0]}}))
    with pytest.raises(LabError, match=f"the weight files lack {lost[0]}, which transformers would fill"):
        load_target(sharded_target, tokenizer=False)
    index.write_text(json.dumps(whole))
    shard = sorted(set(weight_map.values()))[1]
    (sharded_target / shard).unlink()
    with pytest.raises(LabError) as e:
        load_target(sharded_target, tokenizer=False)
    assert str(e.value) == f"{sharded_target}: {index.name} names shard {shard}, which is missing: a partial download?"


@pytest.mark.parametrize("depth", ['"5"', "NaN", "0"])
def test_a_hand_edited_run_record_depth_does_not_reach_the_speculators_config(drafter_dir, depth, capsys):
    """Was exported as `"speculative_tokens": "5"` (or null, from NaN) in the config vLLM reads."""
    (drafter_dir / "run.json").write_text(f'{{"config": {{"ttt_steps": {depth}}}, "target": {{}}}}')
    out = drafter_dir.parent / "out"
    assert main(["export", "--drafter", str(drafter_dir), "--format", "speculators", "--out", str(out)]) == 2
    assert capsys.readouterr().err.endswith(f"'ttt_steps' is {json.loads(depth)!r}, not a positive integer\n")
    assert not out.exists()
    assert main(["export", "--drafter", str(drafter_dir), "--format", "speculators", "--out", str(out),
                 "--speculative-tokens", "3"]) == 0  # a flag that sets it leaves the record unread


def test_a_gptq_drafter_is_named_as_quantized_not_as_lacking_its_weights(drafter_dir):
    """GPTQ stores `qweight` (packed int32) with `scales` in place of a layer's `weight`."""
    name = "midlayer.mlp.up_proj"
    _rewrite(drafter_dir, lambda t: {**{k: v for k, v in t.items() if k != f"{name}.weight"},
                                     f"{name}.qweight": torch.zeros(8, 64, dtype=torch.int32),
                                     f"{name}.scales": torch.ones(1, 64, dtype=torch.float16)},
             lambda c: {**c, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    with pytest.raises(LabError, match=f"tensor '{name}.qweight' belongs to a quantized layer: a quantized drafter "
                                       r"\(gptq\)"):
        read_checkpoint(drafter_dir)


def test_the_refusal_of_a_missing_weight_stands_alone(target_copy, monkeypatch):
    """transformers' LOAD REPORT said the weight was "newly initialized ... consider training" right above the
    lab's refusal of it; the lab's check replaces it, and only for that load."""
    import logging

    from transformers.utils import logging as hf_logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("transformers.modeling_utils")
    monkeypatch.setattr(logger, "handlers", [handler])
    was = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()  # whatever the suite set: the report is a warning
    try:
        _rewrite(target_copy, lambda t: {k: v for k, v in t.items() if k != "model.layers.0.mlp.up_proj.weight"})
        with pytest.raises(LabError, match="lack model.layers.0.mlp.up_proj.weight"):
            load_target(target_copy, tokenizer=False)
    finally:
        hf_logging.set_verbosity(was)
    assert not [m for m in seen if "LOAD REPORT" in m]
    assert not logger.filters
    logger.warning("LOAD REPORT after the load")  # the filter went with the load
    assert seen == ["LOAD REPORT after the load"]
