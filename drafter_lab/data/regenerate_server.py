"""Regeneration through an OpenAI-compatible chat server: SGLang's `launch_server`, `vllm serve`,
or anything that answers `POST /v1/chat/completions`.

For a target that needs a serving stack (tensor parallelism, a real batch scheduler), the server
writes the answers and this module only sends requests, as SpecForge's regeneration does. Turn k of
a conversation is asked with the conversation as already regenerated up to it, as in
`regenerate.regenerate`. Conversations run `concurrency` at a time; each one, once all its turns
are back, is appended to the journal `<out>.partial` (see journal.py), so a killed run resumes
where it stopped. The finished file is written atomically in input order, and the partial
file is removed. Each request asks for plain sampling (servers.py), and where the server
returns the token ids it sampled, each answer keeps them (`token_ids`, as the server gave them) for
a token-exact capture; it keeps the server's `finish_reason` too ("length": cut at max_tokens, so the
end-of-turn token a template writes after it does not train). A server with a reasoning parser on
returns a thinking model's thinking apart from its answer (SGLang `reasoning_content`, vLLM `reasoning`, the answer null when the
thinking ran past `max_tokens`): the answer keeps it as `reasoning_content`, for the chat template
to put back. Requests carry role and content, and for tool use the conversation's `tools`, the
calls (their arguments a JSON string, as the OpenAI API has them) with the thinking that led to
them (`reasoning_content`, as interleaved-thinking clients send it back: templates such as Qwen3's
show it for the turns after the last user turn, which a tool loop's are) and the results' ids; a
turn that makes calls stays as recorded (regenerate.regenerated_turns), a user turn without an answer
(or a tool result that ends the conversation) gets one (regenerate.answer_slots), and an answer in
which the server's tool parser found calls keeps them. Other answers are sent without their thinking:
in a plain chat each precedes the last user turn, where those templates show none.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.data.capture_config import template_setting
from drafter_lab.data.conversations import (
    CUT,
    REASONING_FIELDS,
    Conversation,
    conversations_sha256,
    parse_call,
    write_conversations,
)
from drafter_lab.data.regenerate import (
    SAMPLER,
    answer_slots,
    answers_prompts,
    refuse_unanswering_journal,
    regenerated_turns,
)
from drafter_lab.errors import LabError
from drafter_lab.httpjson import HTTPStatusError, check_timeout, request_json
from drafter_lab.journal import Journal
from drafter_lab.progress import log, maybe_progress
from drafter_lab.servers import PLAIN, served_model


@dataclass
class ServerConfig:
    """How to ask the server, and what to ask it for."""

    url: str
    """Base URL of the server, e.g. http://127.0.0.1:30000 (the /v1/chat/completions path is added)."""
    model: str | None = None
    """Model name sent with each request; None: the first the server's /v1/models lists."""
    temperature: float = 0.0
    """Sampling temperature (0 = greedy)."""
    max_new_tokens: int = 128
    """Longest regenerated assistant turn, in tokens."""
    seed: int = 0
    """Seeds each request, for servers that seed sampling per request: with the conversation's id and
    the turn (`request_seed`), so answers reproduce and no two conversations share a random stream
    (one seed for all would give every copy of a prompt the same sampled answer)."""
    concurrency: int = 8
    """Conversations in flight at once."""
    timeout_s: float = 600.0
    """Seconds to wait for each read from the server (--timeout), not for a whole answer; not part of
    what a resume must match."""
    retries: int = 3
    """Retries of a request that failed to connect or got a 5xx or 429 answer, 1, 2, 4, ... s apart (or
    as its Retry-After asks)."""
    chat_template_kwargs: dict | None = None
    """Sent with each request for the server's chat template (`{"enable_thinking": false}`: a hybrid
    thinking model's thinking off), as SGLang and vLLM take them."""


def _endpoint(cfg: ServerConfig) -> str:
    return cfg.url.rstrip("/") + "/v1/chat/completions"


def request_seed(seed: int, conversation_id: str, turn: int) -> int:
    """The seed of one request: 31 bits of a hash of the run's seed, the conversation and the turn."""
    return int.from_bytes(bytes.fromhex(atomic.sha256_json([seed, conversation_id, turn])[:8]), "big") >> 1


WORKER_CHECK_S = 5.0
"""Seconds between checks, while no worker reports, that some worker is still alive."""

CUT_SHORT = ("abort", "error")
"""Finish reasons of an answer the server stopped before the target ended it (vLLM's and SGLang's)."""


def ask(cfg: ServerConfig, messages: list[dict], tools: list[dict] | None, seed: int) -> tuple[dict, list[int] | None]:
    """The server's answer to `messages` (offering `tools`) as a turn's fields (`content`, and
    `reasoning_content` or `tool_calls` when the server parsed those out, `finish_reason` when it gives
    one), and the token ids it sampled (None from a server that does not return them); a failure that
    retries do not cure is a LabError naming the URL."""
    # return_token_ids: recent vLLM and SGLang answer with choices[0].token_ids, the end token they
    # stopped at included; servers without it ignore the field.
    request = {"model": cfg.model, "messages": messages, "max_tokens": cfg.max_new_tokens,
               "temperature": cfg.temperature, "seed": seed, **PLAIN,
               "return_token_ids": True,
               **template_setting(cfg.chat_template_kwargs), **({"tools": tools} if tools is not None else {})}
    answer = request_json(_endpoint(cfg), request, timeout_s=cfg.timeout_s, retries=cfg.retries)
    try:
        choice = answer["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):  # null (a gateway's filtered answer) or text: no fields to read
            raise TypeError
        named = next((k for k in REASONING_FIELDS if message.get(k)), None)  # the first with a value
        reasoning = None if named is None else message[named]
        calls = message.get("tool_calls") or None
        # A null content may be left out (a gateway writing without nulls, as LiteLLM's proxy does)
        content = message.get("content")
        text = content if content is not None or (reasoning, calls) == (None, None) else ""
        if not isinstance(text, str):
            raise TypeError
    except (KeyError, IndexError, TypeError):
        raise LabError(f"server answer has no text at choices[0].message.content: {str(answer)[:200]}",
                       _endpoint(cfg)) from None
    if not isinstance(reasoning, (str, type(None))):  # the content is there: name the field that is wrong
        raise LabError(f"server answer's choices[0].message.{named} is {type(reasoning).__name__}, not text: "
                       f"{str(reasoning)[:200]}", _endpoint(cfg))
    # SGLang and vLLM answer an aborted request (an /abort_request, an engine error) with 200 and what it had
    # generated so far: not the target's answer, and the next turn would be asked after it.
    if choice.get("finish_reason") in CUT_SHORT:
        raise LabError(f"server ended the answer early (finish_reason {choice['finish_reason']!r}), not at an end "
                       "token or max_tokens; run again to resume", _endpoint(cfg))
    ids = choice.get("token_ids")
    if ids is not None and not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
        raise LabError(f"server answer's choices[0].token_ids is not a list of token ids: {str(ids)[:200]}",
                       _endpoint(cfg))
    if calls is not None:
        if not isinstance(calls, list):
            raise LabError(f"server answer's choices[0].message.tool_calls is not a list: {str(calls)[:200]}",
                           _endpoint(cfg))
        calls = [parse_call(c, "server answer", _endpoint(cfg)) for c in calls]
    # "length": cut at max_tokens, the target had not stopped (capture leaves the end token after it out of the mask)
    reason = choice.get("finish_reason")
    return {"content": text, **({"reasoning_content": reasoning} if reasoning else {}),
            **({"tool_calls": calls} if calls else {}),
            **({"finish_reason": reason} if isinstance(reason, str) else {})}, ids


SENT = ("role", "content", "tool_calls", "tool_call_id", "name")
"""The fields of a turn a server is sent, besides a calling turn's thinking (never the ids of an
earlier regeneration)."""


def _wire(messages: list[dict]) -> list[dict]:
    """Turns as the OpenAI API writes them: the fields in SENT, a call's arguments a JSON string, and
    the thinking of a turn making calls."""
    def call(c: dict) -> dict:
        return {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}

    def turn(m: dict) -> dict:
        if "tool_calls" not in m:
            return {k: m[k] for k in SENT if k in m}
        thought = {"reasoning_content": m["reasoning_content"]} if "reasoning_content" in m else {}
        return {**{k: m[k] for k in SENT if k in m}, "tool_calls": [call(c) for c in m["tool_calls"]], **thought}
    return [turn(m) for m in messages]


def _regenerate_one(cfg: ServerConfig, conv: Conversation) -> Conversation:
    out = Conversation(id=conv.id, messages=answer_slots(conv.messages), tools=conv.tools)
    for i in regenerated_turns(out):
        try:
            turn, ids = ask(cfg, _wire(out.messages[:i]), out.tools, request_seed(cfg.seed, conv.id, i))
        except LabError as e:  # a refusal of one conversation (too long for the context) names it, and what to do
            refused = isinstance(e, HTTPStatusError) and e.status in (400, 413, 422)
            advice = (", was refused (shorten or leave out that conversation, or lower --max-new-tokens if the "
                      "context is full)") if refused else ""
            raise LabError(f"conversation {conv.id}, turn {i + 1}{advice}: {e}") from None
        sampled = {"token_ids": ids, "temperature": cfg.temperature} if ids is not None else {}
        reason = {"finish_reason": turn.pop("finish_reason")} if "finish_reason" in turn else {}
        out.messages[i] = {"role": "assistant", **turn, **sampled, **reason}  # nothing of the old answer stays
    return out


def _settings(cfg: ServerConfig, source: Path, conversations: list[Conversation] = ()) -> dict:
    """What decides a server regeneration's output; with `conversations`, whether prompts are answered: a
    journal from before (regenerate.answers_prompts) holds such rows with their prompts unanswered, and is refused."""
    skip = ("url", "concurrency", "timeout_s", "retries", "chat_template_kwargs")
    keep = {k: v for k, v in asdict(cfg).items() if k not in skip}
    return {**keep, **template_setting(cfg.chat_template_kwargs), **SAMPLER, "request_seeds": "per turn",
            "conversations_sha256": conversations_sha256(source), **answers_prompts(conversations)}


def check_settings(cfg: ServerConfig) -> None:
    """Refuse, one field at a time (`data regenerate` names them as its flags), what would never finish or
    ask for nonsense: retries < 0 retried a refused connection forever; a NaN temperature was sent as sampling."""
    for name in ("concurrency", "max_new_tokens"):
        if getattr(cfg, name) < 1:
            raise LabError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.retries < 0:
        raise LabError(f"retries must be >= 0, got {cfg.retries}")
    check_timeout(cfg.timeout_s)
    if not 0 <= cfg.temperature < math.inf:
        raise LabError(f"temperature must be a finite number >= 0, got {cfg.temperature}")


def regenerate_via_server(conversations: list[Conversation], source: Path, out: Path, cfg: ServerConfig,
                          show_progress: bool = True) -> list[Conversation]:
    """Regenerate every assistant turn of `conversations` (read from `source`), and answer each user turn
    without one, through the server at `cfg.url`, into `out` (jsonl); returns the regenerated conversations
    in input order. A conversation's failure names it and `source`, as a local regeneration's does."""
    check_settings(cfg)
    if cfg.model is None:
        cfg = replace(cfg, model=served_model(cfg.url, cfg.timeout_s, cfg.retries))
    partial, settings = out.with_name(out.name + ".partial"), _settings(cfg, source, conversations)
    refuse_unanswering_journal(Journal.settings_of(partial), settings, partial)  # named, as a local one is
    journal = Journal(partial, settings)
    done = {r["id"]: Conversation.of(r) for r in journal.records}
    todo = [c for c in conversations if c.id not in done]
    waiting, finished, failed = queue.SimpleQueue(), queue.SimpleQueue(), threading.Event()
    for c in todo:
        waiting.put(c)
    busy, lock = [0], threading.Lock()  # conversations in flight, for the log of a failure

    def slot() -> None:  # one of the `concurrency`: conversations in turn until the queue is empty or dropped
        while not failed.is_set():
            try:
                conv = waiting.get_nowait()
            except queue.Empty:
                break
            with lock:
                busy[0] += 1
            try:
                result = _regenerate_one(cfg, conv)
            except BaseException as e:  # raised in the main thread, as a worker's death would leave it waiting
                failed.set()  # before the next conversation this slot would take
                result = e
            with lock:
                busy[0] -= 1
            finished.put(result)
        finished.put(None)

    failure: BaseException | None = None
    slots = min(cfg.concurrency, len(todo))
    try:
        with journal, maybe_progress("regenerate", len(conversations), show_progress) as advance:
            advance(len(done))
            # Daemon threads: Ctrl-C abandons the conversations in flight, which would otherwise hold
            # the exit until each had all its turns back, only for them to be thrown away.
            workers = [threading.Thread(target=slot, name="drafter-lab-regenerate", daemon=True) for _ in range(slots)]
            for w in workers:
                w.start()
            ended = 0
            while ended < slots:
                # No timeout on an answer (one may take minutes; --timeout bounds each read), but a worker
                # gone without its last report would leave this waiting forever. Each reports before it
                # ends, so a queue empty after all are gone holds nothing more.
                try:
                    item = finished.get(timeout=WORKER_CHECK_S)
                except queue.Empty:
                    if any(w.is_alive() for w in workers) or not finished.empty():
                        continue
                    raise LabError("regenerate: its workers are gone without reporting their end (a bug); the "
                                   "conversations journalled so far resume", source) from None
                if item is None:
                    ended += 1
                elif isinstance(item, BaseException):  # the first failure drops the queue; what is in flight still lands
                    if failure is None:
                        failure = item
                        with lock:
                            in_flight = busy[0]
                        log(f"regenerate: {item}; journalling the {in_flight} conversations in flight for a resume, "
                            "then stopping")
                else:
                    journal.append(item.record())
                    done[item.id] = item
                    advance(1)
    finally:
        failed.set()  # Ctrl-C: the queue is dropped
    if failure is not None:
        if isinstance(failure, LabError) and failure.path is None:  # a conversation's: it names that, this its file
            raise LabError(str(failure), source) from None
        raise failure
    result = [done[c.id] for c in conversations]
    answers = [c.messages[i] for c in result for i in regenerated_turns(c)]
    cut = sum(m.get("finish_reason") == CUT for m in answers)
    if cut:  # a result, not progress: said without the progress display too
        log(f"regenerate: {cut} of {len(answers)} answers reached --max-new-tokens {cfg.max_new_tokens} before the "
            f"target stopped (finish_reason {CUT!r}): the end-of-turn token after them does not train")
    write_conversations(out, result)
    journal.discard()
    return result
