"""Self-distillation: replace each assistant turn with the target's own generation.

A drafter learns to predict the target; training on the target's own answers (the seeds' "synth"
data) matches what it will see when serving. Turn k of every conversation is generated in round
k, from the conversation as already regenerated (so later turns follow the target's earlier
answers, as in a real chat). Prompts are batched with left padding and decoded with HF `generate`
(KV cache); each answer stops at an end-of-turn/eos token or after `max_new_tokens`. Each answer
keeps the token ids the target produced (`token_ids`, its end token left out), the temperature it
sampled them at, the target's fingerprint and how its prompt was rendered (`rendered_with`: the chat
template's hash and variables) beside its text, so that a capture can use the target's own tokens
(`data prepare --token-exact`) and refuse another target's, or answers that followed other prompts
than the capture's, and its `finish_reason` ("length" where it ran to `max_new_tokens`, else
"stop"), so that the end-of-turn token a template writes after a cut answer does not train. A
thinking model's answer holds its thinking as the model wrote it (`<think>...</think>` and the
answer, which a thinking template such as Qwen3's reads apart), so the turn's old `reasoning_content`
goes; one in harmony's channels (GPT-OSS) is split as a server splits it, and think tags a tokenizer
marks special stay (`answer_fields`). A turn that makes tool calls stays as recorded
(`regenerated_turns`): the tool results after it answer those calls, and no tool runs here; the turns
around it are the target's. A user turn that no assistant turn follows (a file of prompts alone,
SpecForge's usual input for regenerating data, or a chat that ends on a question) gets an answer
written after it (`answer_slots`): [user, user] becomes [user, answer, user, answer]. A journal
(journal.py) records each batch as it finishes, so a killed run resumes.
"""

from __future__ import annotations

import base64
import copy
import re
from dataclasses import replace
from itertools import chain
from pathlib import Path

import torch

from drafter_lab.data.capture_config import STOP_IDS, device_setting, without
from drafter_lab.data.chat import THINK_TAGS, render, rendered_with, special_token_ids
from drafter_lab.data.conversations import CUT, Conversation, conversations_sha256
from drafter_lab.errors import LabError
from drafter_lab.journal import Journal
from drafter_lab.progress import log, maybe_progress
from drafter_lab.targets.hf import pad_token_id, stop_token_ids


def regenerated_turns(conv: Conversation) -> list[int]:
    """The assistant turns a regeneration writes anew: all but those making tool calls, which stay as
    recorded, since the tool results after them answer those calls and no tool runs here."""
    return [i for i in conv.assistant_turns() if "tool_calls" not in conv.messages[i]]


def unanswered(messages: list[dict]) -> list[int]:
    """The indices of the turns of `messages` waiting for an answer: each user turn that no assistant turn
    follows, and a tool result that ends them (an agent's trace cut where its tool returned, as a request
    served mid-task is)."""
    last = len(messages) - 1
    return [j for j, m in enumerate(messages)
            if (m["role"] == "user" and (j == last or messages[j + 1]["role"] != "assistant"))
            or (m["role"] == "tool" and j == last)]


def answer_slots(messages: list[dict]) -> list[dict]:
    """A copy of `messages` with an empty assistant turn after each turn waiting for an answer
    (`unanswered`), for the target to write: a prompt is answered as a recorded answer is rewritten."""
    gaps = set(unanswered(messages))
    out = []
    for j, m in enumerate(messages):
        out.append(copy.deepcopy(m))
        if j in gaps:
            out.append({"role": "assistant", "content": ""})
    return out


ANSWERS_PROMPTS = {"user_turns_without_answer": "answered"}
"""In a regeneration's settings where a conversation has a user turn without an answer (`answer_slots`).
A lab before answer slots (2026-12-05) answered none: its journal records a row [user, user, answer]'s
answer as round 0, which is now the first user turn's, and its output (or `data prepare --regenerate`'s
cache, which also dropped rows of prompts alone) lacks those answers; neither is resumed or reused.
Absent where every user turn has its answer, so such files' journals and caches are found as before."""

ANSWERS_TOOL_RESULTS = {"tool_results_ending_a_conversation": "answered"}
"""As ANSWERS_PROMPTS, where a conversation ends in a tool result: a lab before 2026-12-06 left those
unanswered, so its journal or cache lacks the answers now written after them."""


def answers_prompts(conversations: list[Conversation]) -> dict:
    """ANSWERS_PROMPTS where a user turn of `conversations` has no answer yet, ANSWERS_TOOL_RESULTS where
    one of them ends in a tool result, else nothing."""
    asking = {c.messages[j]["role"] for c in conversations for j in unanswered(c.messages)}
    return {**(ANSWERS_PROMPTS if "user" in asking else {}), **(ANSWERS_TOOL_RESULTS if "tool" in asking else {})}


def answerable(conversations: list[Conversation], skipped: dict, path: Path, strict: bool = False) -> list[Conversation]:
    """`conversations` (read as prompts) less those with no user or assistant turn, nothing to answer or
    rewrite, counted in `skipped` as `no_user_or_assistant_turn` (under `strict`, an error naming `path`)."""
    kept, bare = [], []
    for c in conversations:
        (kept if any(m["role"] in ("user", "assistant") for m in c.messages) else bare).append(c)
    if bare and strict:
        raise LabError(f"conversation {bare[0].id} has no user or assistant turn (--strict)", path)
    if bare:
        skipped["no_user_or_assistant_turn"] = skipped.get("no_user_or_assistant_turn", 0) + len(bare)
    return kept


def refuse_unanswering_journal(before: dict | None, now: dict, journal: Path) -> None:
    """Refuse a journal (settings `before`) begun without ANSWERS_PROMPTS or ANSWERS_TOOL_RESULTS where `now`
    holds it: a lab before those answers recorded a row's answers by other rounds, or none for those turns."""
    for answers, what in ((ANSWERS_PROMPTS, "user turns without an answer"),
                          (ANSWERS_TOOL_RESULTS, "a tool result that ends a conversation")):
        key = next(iter(answers))
        if before is not None and key in now and key not in before:
            raise LabError(f"begun before the lab recorded that it answers {what}: its answers may be those of "
                           "other turns than they would fill now; delete it to start over", journal)


# Every knob a model's generation_config.json may set that reshapes the distribution (Qwen2.5 ships
# top_k 20, top_p 0.8, repetition_penalty 1.05), set to its neutral value: `generate` fills the knobs
# left unset from that file and then from its own defaults (top_k 50), which would truncate.
NEUTRAL_SAMPLING = dict(top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
                        repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0)
SAMPLING_ONLY = ("top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
"""Those that act only when sampling: set for a greedy run, transformers warns that they are ignored."""


SAMPLER = {"sampler": "plain"}
"""Names the sampler in a regeneration's settings (argmax, or softmax(logits / T) over the whole
vocabulary, nothing inherited from the model's generation config): data made before, when `generate`
filled in top-k 50 and the model's own knobs, is other data, and a journal or manifest of it is refused."""


def generation_config(target, temperature: float, max_new_tokens: int):
    """HF generation settings: greedy at temperature 0, else softmax(logits / temperature) over the
    whole vocabulary, as `eval --temperature` serves; stops at any end token."""
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else 1.0,
        eos_token_id=stop_token_ids(target),
        pad_token_id=pad_token_id(target),  # fed back for finished rows: one past the embeddings fails
        **{k: v for k, v in NEUTRAL_SAMPLING.items() if temperature > 0 or k not in SAMPLING_ONLY},
    )


def generate_texts(target, prompts: list[str], gen_config) -> list[tuple[str, list[int]]]:
    """One left-padded `generate` over rendered prompts; each answer's text and token ids up to its
    end token."""
    tok = target.tokenizer
    side = tok.padding_side
    tok.padding_side = "left"  # generated tokens must follow each prompt directly
    try:
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False, return_attention_mask=True)
    finally:
        tok.padding_side = side
    # Not token_type_ids, which a tokenizer listing them (transformers 4's default for a plain fast
    # tokenizer) returns, and which `generate` refuses for a causal LM.
    enc["input_ids"][enc["attention_mask"] == 0] = gen_config.pad_token_id  # the tokenizer's may be no embedded id
    enc = {k: enc[k].to(target.device) for k in ("input_ids", "attention_mask")}
    model = target.model
    # `generate` fills what `gen_config` leaves at a default from the model's own generation_config.json,
    # which may ask for beams, banned words or suppressed tokens: for the call, that is `gen_config` too
    own, model.generation_config = model.generation_config, gen_config
    try:
        with torch.no_grad():
            out = model.generate(**enc, generation_config=gen_config)
    finally:
        model.generation_config = own
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    stops = set(gen_config.eos_token_id)
    answers = []
    for row in new:
        end = next((j for j, t in enumerate(row) if t in stops), len(row))
        answers.append((tok.decode(row[:end], skip_special_tokens=True), row[:end]))
    return answers


HARMONY_CHANNEL = "<|channel|>"
"""The special token that opens a harmony message's channel (GPT-OSS)."""
HARMONY_MESSAGE = re.compile(r"<\|channel\|>(\w+)[^<]*<\|message\|>(.*?)(?=<\|end\|>|<\|start\|>|\Z)", re.S)
"""One harmony message in a decoded answer: its channel (analysis, commentary, final) and its text."""


def answer_fields(tokenizer, text: str, ids: list[int]) -> dict:
    """The fields of an answer's message (`text`, its ids decoded without special tokens): where the
    target wrote harmony's channels, its analysis as `reasoning_content` and its final channel as
    `content`, as GPT-OSS's parsers in vLLM and SGLang split them (without special tokens the headers
    vanish and the channel names run into the texts: "analysisThey ask.assistantfinalIt joins.");
    else `content`, the text, thinking inline with its tags (`<think>`, Mistral's `[THINK]`), kept where
    the tokenizer marks them special (as some do, and Mistral's always), so that the lab still reads
    the thinking apart from the answer."""
    channel = tokenizer.convert_tokens_to_ids(HARMONY_CHANNEL)
    if channel is None or channel == tokenizer.unk_token_id or channel not in ids:
        # A tag the vocabulary lacks converts to the unknown token, itself special: not a tag to keep
        tags = {i for i in tokenizer.convert_tokens_to_ids([*chain(*THINK_TAGS)])
                if i != tokenizer.unk_token_id and i in special_token_ids(tokenizer)}
        return {"content": _decoded_keeping(tokenizer, ids, tags) if tags & set(ids) else text}
    messages = HARMONY_MESSAGE.findall(tokenizer.decode(ids, skip_special_tokens=False))
    analysis = "".join(t for c, t in messages if c == "analysis")
    return {"content": "".join(t for c, t in messages if c == "final"),
            **({"reasoning_content": analysis} if analysis else {})}


def _decoded_keeping(tokenizer, ids: list[int], keep: set[int]) -> str:
    """`ids` decoded without special tokens but those in `keep`, which stay as their text."""
    pieces, start = [], 0
    for j, t in enumerate(ids):
        if t in keep:
            pieces += [tokenizer.decode(ids[start:j], skip_special_tokens=True), tokenizer.convert_ids_to_tokens(t)]
            start = j + 1
    return "".join([*pieces, tokenizer.decode(ids[start:], skip_special_tokens=True)])


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return {k: base64.b64encode(v.numpy().tobytes()).decode() for k, v in state.items()}


def _set_rng_state(state: dict, device: torch.device, journal: Path) -> None:
    begun_on = "cuda" if "cuda" in state else "cpu"
    if begun_on != device.type:  # the devices sample from other streams: the rest would be neither run's
        raise LabError(f"this sampled run began on {begun_on}; resume it there, or delete the file to start over",
                       journal)

    def tensor(k):
        return torch.frombuffer(bytearray(base64.b64decode(state[k])), dtype=torch.uint8)

    torch.set_rng_state(tensor("cpu"))
    if device.type == "cuda":
        torch.cuda.set_rng_state(tensor("cuda"), device)


def _prompt(tokenizer, conv: Conversation, i: int, template_kwargs: dict | None) -> str:
    """The prompt of `conv`'s turn i; a chat template's refusal (roles that do not alternate, or an
    answer with no turn before it) names the conversation, to be found among thousands."""
    try:
        return render(tokenizer, conv.messages[:i], True, template_kwargs, conv.tools)
    except LabError as e:
        raise LabError(f"conversation {conv.id}, turn {i + 1}: {e}") from None


def regenerate(
    target,
    conversations: list[Conversation],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    batch_size: int = 16,
    seed: int = 0,
    template_kwargs: dict | None = None,
    show_progress: bool = True,
    journal: Journal | None = None,
) -> list[Conversation]:
    """Copies of `conversations` whose assistant turns the target wrote (temperature 0 = greedy), one
    added after each user turn without an answer, or tool result ending one (`answer_slots`).

    With a `journal`, each batch's answers are recorded as it finishes (with the RNG state after
    it when sampling), and the batches an earlier run recorded are replayed instead of generated:
    a killed run resumes and ends with the same conversations, bit for bit, as one that was not.
    `template_kwargs` go to the chat template (chat.render), as a server's `chat_template_kwargs`.
    `show_progress=False` keeps tensor-parallel ranks other than 0 quiet.
    """
    gen_config = generation_config(target, temperature, max_new_tokens)
    convs = [replace(c, messages=answer_slots(c.messages)) for c in conversations]
    turns = [regenerated_turns(c) for c in convs]
    rounds = max((len(t) for t in turns), default=0)
    records = journal.records if journal is not None else []
    prompted = rendered_with(target.tokenizer, template_kwargs)
    # A journal from before ids were kept names no sampler in its settings, so it never gets here.
    recorded = {(r["round"], cid): (text, r["token_ids"][cid]) for r in records for cid, text in r["answers"].items()}
    # A template's refusal (Llama 3.1's of parallel calls, roles out of turn) met in a later round ended the run
    # after the earlier rounds' generation, which a rerun of the file without that conversation could not
    # resume: every prompt renders first, with the recorded answers in place of those to come.
    for c, t in zip(convs, turns):
        for i in t:
            _prompt(target.tokenizer, c, i, template_kwargs)
    with torch.random.fork_rng(devices=[target.device] if target.device.type == "cuda" else []):
        torch.manual_seed(seed)
        if records and temperature > 0:  # replayed batches draw nothing: continue from the last one's state
            _set_rng_state(records[-1]["rng"], target.device, journal.path)
        with maybe_progress("regenerate", sum(len(t) for t in turns), show_progress) as advance:
            for k in range(rounds):
                jobs = [(c, t[k]) for c, t in zip(convs, turns) if len(t) > k]
                prompts = [_prompt(target.tokenizer, c, i, template_kwargs) for c, i in jobs]
                # Similar lengths together: less padding. Stable sort keeps the batches deterministic.
                order = sorted(range(len(jobs)), key=lambda j: len(prompts[j]))
                for b in range(0, len(order), batch_size):
                    chunk = order[b : b + batch_size]
                    ids = [jobs[j][0].id for j in chunk]
                    if all((k, cid) in recorded for cid in ids):
                        answers = [recorded[k, cid] for cid in ids]
                    else:
                        answers = generate_texts(target, [prompts[j] for j in chunk], gen_config)
                        if journal is not None:
                            rng = {"rng": _rng_state(target.device)} if temperature > 0 else {}
                            journal.append({"round": k, "answers": {c: a[0] for c, a in zip(ids, answers)},
                                            "token_ids": {c: a[1] for c, a in zip(ids, answers)}, **rng})
                    for j, (text, token_ids) in zip(chunk, answers):
                        conv, i = jobs[j]
                        conv.messages[i].pop("reasoning_content", None)
                        conv.messages[i].pop("finish_reason", None)  # an earlier regeneration's; last, as a server's
                        reason = finish_reason(token_ids, max_new_tokens)
                        conv.messages[i].update(**answer_fields(target.tokenizer, text, token_ids), token_ids=token_ids,
                                                temperature=temperature, target_fingerprint=target.fingerprint,
                                                rendered_with=prompted, finish_reason=reason)
                    advance(len(chunk), round=k + 1)
    cut = sum(convs[c].messages[i].get("finish_reason") == CUT for c, t in enumerate(turns) for i in t)
    if cut and show_progress:
        log(f"regenerate: {cut} of {sum(map(len, turns))} answers reached --max-new-tokens {max_new_tokens} before "
            f"the target stopped (finish_reason {CUT!r}): the end-of-turn token after them does not train")
    return convs


def finish_reason(token_ids: list[int], max_new_tokens: int) -> str:
    """An answer's finish reason, as a server names it: `generate` ran a row to `max_new_tokens` only when
    it met no end token, which its `token_ids` leave out, so the count alone tells (for a journal's answers
    too, which record no reason)."""
    return CUT if len(token_ids) >= max_new_tokens else "stop"


def regeneration_settings(target, source: Path, temperature: float, max_new_tokens: int, batch_size: int,
                          seed: int, template_kwargs: dict | None = None,
                          conversations: list[Conversation] = ()) -> dict:
    """Everything that decides a local regeneration's output: a journal made with other settings is refused.
    The target counts by what it is, not by where: its path spelled otherwise, or moved, resumes. Its
    device type counts (a GPU rounds otherwise, so even greedy answers can differ), where not the CPU:
    journals begun on the CPU before it counted still resume. `conversations`, those read from `source`,
    say whether prompts are answered (`answers_prompts`)."""
    return {"target": without(target.describe(), ["path"]), "conversations_sha256": conversations_sha256(source),
            "temperature": temperature, "max_new_tokens": max_new_tokens, "batch_size": batch_size, "seed": seed,
            **SAMPLER, **rendered_with(target.tokenizer, template_kwargs), STOP_IDS: stop_token_ids(target),
            **device_setting(target.device), **answers_prompts(conversations)}
