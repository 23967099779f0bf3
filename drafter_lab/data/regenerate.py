"""Self-distillation: replace each assistant turn with the target's own generation.

A drafter learns to predict the target; training on the target's own answers (the seeds' "synth"
data) matches what it will see when serving. Turn k of every conversation is generated in round
k, from the conversation as already regenerated (so later turns follow the target's earlier
answers, as in a real chat). Prompts are batched with left padding and decoded with HF `generate`
(KV cache); each answer stops at an end-of-turn/eos token or after `max_new_tokens`.
"""

from __future__ import annotations

import copy

import torch

from drafter_lab.data.chat import render
from drafter_lab.data.conversations import Conversation
from drafter_lab.progress import maybe_progress


def stop_token_ids(target) -> list[int]:
    """The tokenizer's eos plus every eos the model's generation config lists (e.g. <|eot_id|>)."""
    ids = [] if target.tokenizer.eos_token_id is None else [int(target.tokenizer.eos_token_id)]
    gen_eos = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    for i in gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return ids


def generation_config(target, temperature: float, max_new_tokens: int):
    """HF generation settings: greedy at temperature 0, else plain sampling; stops at any end token."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_k=None,
        top_p=None,
        eos_token_id=stop_token_ids(target),
        pad_token_id=target.tokenizer.pad_token_id,
    )


def generate_texts(target, prompts: list[str], gen_config) -> list[str]:
    """One left-padded `generate` over rendered prompts; each answer's text up to its end token."""
    tok = target.tokenizer
    side = tok.padding_side
    tok.padding_side = "left"  # generated tokens must follow each prompt directly
    try:
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = side
    enc = {k: v.to(target.device) for k, v in enc.items()}
    with torch.no_grad():
        out = target.model.generate(**enc, generation_config=gen_config)
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    stops = set(gen_config.eos_token_id)
    texts = []
    for row in new:
        end = next((j for j, t in enumerate(row) if t in stops), len(row))
        texts.append(tok.decode(row[:end], skip_special_tokens=True))
    return texts


def regenerate(
    target,
    conversations: list[Conversation],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    seed: int = 0,
    show_progress: bool = True,
) -> list[Conversation]:
    """Copies of `conversations` whose assistant turns the target wrote (temperature 0 = greedy).

    `show_progress=False` keeps tensor-parallel ranks other than 0 quiet.
    """
    gen_config = generation_config(target, temperature, max_new_tokens)
    convs = [Conversation(id=c.id, messages=copy.deepcopy(c.messages)) for c in conversations]
    turns = [c.assistant_turns() for c in convs]
    rounds = max((len(t) for t in turns), default=0)
    with torch.random.fork_rng(devices=[target.device] if target.device.type == "cuda" else []):
        torch.manual_seed(seed)
        with maybe_progress("regenerate", sum(len(t) for t in turns), show_progress) as advance:
            for k in range(rounds):
                jobs = [(c, t[k]) for c, t in zip(convs, turns) if len(t) > k]
                prompts = [render(target.tokenizer, c.messages[:i], add_generation_prompt=True) for c, i in jobs]
                # Similar lengths together: less padding. Stable sort keeps the batches deterministic.
                order = sorted(range(len(jobs)), key=lambda j: len(prompts[j]))
                for b in range(0, len(order), batch_size):
                    chunk = order[b : b + batch_size]
                    texts = generate_texts(target, [prompts[j] for j in chunk], gen_config)
                    for j, text in zip(chunk, texts):
                        conv, i = jobs[j]
                        conv.messages[i]["content"] = text
                    advance(len(chunk), round=k + 1)
    return convs
