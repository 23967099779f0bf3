"""Conversations in SpecForge / ShareGPT jsonl: one JSON object per line. A file that begins with `[`
is one JSON array of those objects (ShareGPT's own dump; SpecForge reads both through `datasets`),
and a gzip-compressed file is read as the file it holds, as `datasets` reads one. UTF-16 or UTF-32
text (Windows tools write UTF-16 with a byte order mark) is read as its UTF-8, as is UTF-8 with a BOM.

Each line holds `conversations` (or `messages`; a null one is absent, as pandas and `datasets` write a
table of both dialects): a list of turns written either as
`{"role": ..., "content": ...}` (SpecForge, OpenAI) or `{"from": ..., "value": ...}` (ShareGPT,
where `human` means user and `gpt` means assistant, as do `chatgpt`, `bing` and `bard` in ShareGPT's
own dump, which SpecForge's prepare_data.py maps so too). An optional `id` (text or a number, a number
named as Python writes it: `2.5` as "2.5", `1e2` as "100.0", `1.0` as "1.0", another id than `1`'s; an
array, object or boolean is an error) names the conversation (as text); without one (or with an empty one,
which names nothing) the id is a hash of its turns, so the train/val split stays stable across reruns.
A repeated id is a repeated conversation, skipped; a number and a string alike as text (`1`, `"1"`)
are an error: two conversations (of two datasets merged, say) the lab could not tell apart.
A top-level `system` string (LLaMA-Factory's ShareGPT column, some OpenAI exports too) is the
conversation's system prompt: it becomes a leading system turn, so the target sees what it is served.

An assistant turn the target regenerated also keeps `token_ids`, the tokens it sampled, and
`temperature`, the temperature it sampled them at (regenerate.py; through a server when the server
returns ids, which may then end with the end token it stopped at), which a token-exact capture reads
instead of tokenizing the text again, and `finish_reason` (`"length"`: cut at --max-new-tokens, the
target had not stopped; `"stop"`: it stopped), as the OpenAI API names it, so that a capture leaves
the end-of-turn token a template writes after a cut answer out of the loss mask (an answer without
one trains it, as before); regenerated locally, also `target_fingerprint`, the target's
(targets/hf.py), and `rendered_with`, the chat template's hash and variables its prompt was rendered
with, so that a token-exact capture with another target, or with prompts rendered otherwise, is
refused (a server says neither which weights it runs nor which template it applies).

An assistant turn of a reasoning model may carry its thinking apart from its answer, as SGLang
(`reasoning_content`) and vLLM (`reasoning`) return it with a reasoning parser on, and as
reasoning datasets store it (`thinking` in GPT-OSS's): each name is read and kept as
`reasoning_content`, the name chat templates (Qwen3, Kimi-K2, DeepSeek) read, so the template renders
it where the target would see it (chat.render also passes it as `thinking`, for harmony's, or as a
thinking content part, for Mistral's). Mistral's own form, thinking parts (`{"type": "thinking",
"thinking": ...}`) ahead of the text parts of an answer, is read as `reasoning_content` too.

Tool use, as the OpenAI API and SGLang and vLLM servers write it: a conversation may list the
`tools` it offers (objects, or a JSON string of them as some datasets store it, an empty one none; the OpenAI API's
`functions` before it had tools, bare function schemas, read as those tools), an assistant turn may
make `tool_calls` (its content then may be null), and a turn with role `tool` (`ipython`, Llama 3's
name; `observation`, ShareGPT's; `function`, the OpenAI API's before it had tools) holds a result (text,
or a JSON value such as an object or an array, read as its JSON text), with its `tool_call_id` and
`name` where given (text, as servers take them: a number is an error). ShareGPT writes a call as a turn
of its own, `function_call`, its value the call (or a list of calls) as JSON: it is read as an assistant
turn making those calls; the OpenAI API's `function_call` on an assistant turn, its one call before
tools, as that call (beside `tool_calls`, where some exports mirror one of them, it must be one). Each
call is kept as a server hands it to the chat template: `{"type": "function", "function": {"name",
"arguments"}}`, the arguments an object (a JSON string of them is parsed), so the template writes the
call in its own format (Qwen's `<tool_call>` tags, Llama 3's JSON) and the tokens train like the rest of
the turn. The tool results never train: they are the tools' text, not the target's.

A turn's content may also be the OpenAI API's list of content parts, all of type "text": they are
joined with newlines, as vLLM joins them for a template that takes text. A tool result that is a JSON
array holding an object with a "type" is read as such parts, and refused unless all are text: the OpenAI
API's tool message takes text parts alone, so such a result goes as its JSON text.

A line that is not JSON, or not shaped like a conversation, is an error naming the file and line
(the item, from 1, of an array); so is a NaN or Infinity (which Python's json reads, and JSON has not)
in what the lab keeps of a row: its id, tools and turns (other columns are not read).
A conversation without an assistant turn has nothing to train on: it is skipped and counted
(an error under `strict`), except where the file holds prompts (`prompts=True`: eval's prompt sets,
MT-bench's among them, hold user turns alone).
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import math
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from drafter_lab import atomic
from drafter_lab.data.capture_config import recorded_kwargs_problem
from drafter_lab.errors import LabError

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
"""Where a turn's thinking may be: SGLang's name (and the templates'), vLLM's, GPT-OSS datasets'."""

_THINKING_RULE = "reasoning_content (or reasoning, thinking) must be text, on an assistant turn"
"""What a turn's thinking must be: its errors say so, then name the field that is not."""

SAMPLING_FIELDS = ("token_ids", "temperature", "target_fingerprint", "rendered_with", "finish_reason")
"""What a regenerated answer keeps about how it was sampled: the lab's, not a chat template's."""

CUT = "length"
"""The `finish_reason` of an answer cut at its token limit (the OpenAI API's, vLLM's and SGLang's): the
target had not stopped, so the end-of-turn token a template writes after it is not the target's."""

ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "developer",  # OpenAI's system turn for reasoning models; GPT-OSS's template reads it
    "tool": "tool",
    "ipython": "tool",
    "observation": "tool",
    "function": "tool",  # the OpenAI API's result turn before tools: {"role": "function", "name", "content"}
}


@dataclass
class Conversation:
    """One conversation: its id and its turns as `{"role", "content"}` dicts (roles normalised; an
    assistant turn may hold `reasoning_content` and `tool_calls`; a regenerated one also `token_ids`,
    `temperature`, `finish_reason` and, made here, `target_fingerprint` and `rendered_with`; a tool turn
    `tool_call_id` and `name`)."""

    id: str
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    """The tools the conversation offers (the chat template's `tools`), None without any."""

    def assistant_turns(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]

    def record(self) -> dict:
        """The conversation as a jsonl line holds it (`Conversation.of` reads it back)."""
        return {"id": self.id, **({"tools": self.tools} if self.tools is not None else {}),
                "conversations": self.messages}

    @classmethod
    def of(cls, record: dict) -> Conversation:
        return cls(id=record["id"], messages=record["conversations"], tools=record.get("tools"))


def content_id(messages: list[dict], tools: list[dict] | None = None) -> str:
    # Reasoning, calls and tools join only where there are some: ids of data without any stay as they were.
    blob = json.dumps([[m["role"], m["content"], *[m[k] for k in ("reasoning_content", "tool_calls") if k in m]]
                       for m in messages] + ([tools] if tools is not None else []), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _json_or_same(value):
    """`value` parsed, where a dataset stored a JSON document as a string; else `value`."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return None  # not JSON: the caller's shape check names it


def _parse_tools(tools, where: str, path, name: str = "tools") -> list[dict]:
    tools = _json_or_same(tools)
    if not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise LabError(f"{where}: {name} must be a list of objects (or a JSON string of one)", path)
    return tools


def _blank_is_none(value):
    """None for an empty (or blank) string, or JSON's null as text: a table's column of JSON text (pandas,
    `datasets`) holds one on rows without any tools or calls, where clients leave them out or send null."""
    return None if isinstance(value, str) and value.strip() in ("", "null") else value


def _row_tools(obj: dict, where: str, path) -> list[dict] | None:
    """A row's `tools`, or the OpenAI API's `functions` from before tools (bare function schemas) in
    the form `tools` takes, so the template offers the functions its calls use; an empty string is none."""
    tools, functions = (_blank_is_none(obj.get(k)) for k in ("tools", "functions"))
    if tools is not None and functions is not None:
        raise LabError(f"{where}: both tools and functions (the older form of tools): keep one", path)
    if functions is not None:
        return [{"type": "function", "function": f} for f in _parse_tools(functions, where, path, "functions")]
    return _parse_tools(tools, where, path) if tools is not None else None


def parse_call(call, where: str, path) -> dict:
    """A tool call in the form servers hand templates: {"id" (where given), "type": "function", "function":
    {"name", "arguments" (an object)}}, from that form or a bare {"id", "name", "arguments"}."""
    # a null `function` is absent: a table of calls of both forms writes one on each bare call
    fn = (call if call.get("function") is None else call["function"]) if isinstance(call, dict) else None
    raw = _blank_is_none(fn.get("arguments")) if isinstance(fn, dict) else None
    # none: absent, null (SGLang's FunctionResponse allows it, a table writes it) or "" as some clients record
    args = {} if raw is None else _json_or_same(raw)
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(args, dict)):
        raise LabError(f"{where}: a tool call needs a name and arguments (an object, or a JSON string of one)", path)
    if (bad := _non_finite(args)) is not None:  # a server's arguments too, parsed from its JSON text
        raise LabError(f"{where}: a tool call's arguments hold {json.dumps(bad)}, which is not a JSON number", path)
    # id and type are the call's, never its function's (a bare call holds them beside its name): templates
    # read tool_call.id (Mistral's)
    fields = {k: v for k, v in fn.items() if k not in ("id", "type", "function")}
    out = {"type": "function", "function": {**fields, "arguments": args}}
    cid = call.get("id")  # text, as a tool turn's tool_call_id that answers it (null: none)
    if cid is not None and not isinstance(cid, str):
        raise LabError(f"{where}: a tool call's id is {type(cid).__name__}, not text", path)
    return {"id": cid, **out} if cid is not None else out


def _non_finite(value) -> float | None:
    """The first NaN or infinity in `value` (at any depth of its dicts and lists), None without one."""
    # A stack, not recursion: json reads nesting about twice as deep as a recursive walk here could go.
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return v
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        stack.extend(reversed(list(items)))
    return None


def _text_of(content, where: str, path, role: str) -> str:
    """A turn's text: a string, or the OpenAI API's list of content parts, all text, joined with
    newlines as vLLM joins them for a chat template that takes text."""
    if isinstance(content, list):
        k = next((k for k, c in enumerate(content, 1)
                  if not (isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str))), None)
        if k is None:
            return "\n".join(c["text"] for c in content)
        # OpenAI's tool message takes text parts alone; a result that is a JSON array of objects with a
        # "type" (search hits, say) reads as parts, so its refusal says how to give it instead.
        why = "a drafter of text reads no images or audio; " + (
            "a result that is a JSON array of typed objects goes as its JSON text" if role == "tool" else
            "an answer's thinking parts go ahead of its text")
        raise LabError(f'{where}: turn content parts must all be {{"type": "text", "text": ...}}, and part {k} '
                       f"is not ({why})", path)
    if not isinstance(content, str):
        raise LabError(f"{where}: turn content is {type(content).__name__}, not text", path)
    return content


def _thinking_parts(content, where: str, path) -> tuple[object, str | None]:
    """Mistral's thinking parts ahead of a turn's text (`{"type": "thinking", "thinking": ...}`, as
    mistral-common and Magistral's chat template keep an answer's thinking): the parts after them,
    and their thinking joined with newlines (None without any)."""
    if not isinstance(content, list):
        return content, None
    n = next((j for j, c in enumerate(content) if not (isinstance(c, dict) and c.get("type") == "thinking")), len(content))
    thoughts = [c.get("thinking") for c in content[:n]]
    if not all(isinstance(t, str) for t in thoughts):
        raise LabError(f'{where}: a thinking part needs its text as "thinking"', path)
    return content[n:], "\n".join(thoughts) if n else None


def _either(obj: dict, key: str, other: str):
    """obj[key], else obj[other]: a file of both dialects written through pandas or `datasets` (one
    table) holds each row's keys of the other dialect as null."""
    value = obj.get(key)
    return obj.get(other) if value is None else value


def _calls_of(raw):
    """tool_calls as given, or parsed from the JSON string some datasets store them as (as tools and
    arguments: "[]" is none, as [] is); an empty string is none, other text stays, to be refused as no list."""
    raw = _blank_is_none(raw)
    calls = _json_or_same(raw)  # a list (or None) as it is
    return raw if calls is None else calls


def _parse_turn(turn, where: str, path) -> dict:
    if not isinstance(turn, dict):
        raise LabError(f"{where}: a turn is {type(turn).__name__}, not an object", path)
    role = _either(turn, "role", "from")
    content = _either(turn, "content", "value")
    if str(role).lower() == "function_call":  # ShareGPT's call turn: the value is the call, or a list of them, as JSON
        calls = _json_or_same(content)
        turn = {"role": "assistant", "content": "", "tool_calls": calls if isinstance(calls, list) else [calls]}
        role, content = "assistant", ""
    content, thought = _thinking_parts(content, where, path)
    # The first with text, as regenerate_server.ask takes it: a server may send "" under one name and
    # the thinking under another. An empty one still counts as given (a null answer becomes "").
    given = [k for k in REASONING_FIELDS if turn.get(k) is not None]
    if (bad := next((k for k in given if not isinstance(turn[k], str)), None)) is not None:
        raise LabError(f"{where}: {_THINKING_RULE}: {bad} is {type(turn[bad]).__name__}", path)
    named = next((k for k in given if turn[k]), given[0] if given else None)  # the field the thinking is read from
    reasoning = None if named is None else turn[named]
    if thought is not None:
        if reasoning is not None:
            raise LabError(f"{where}: thinking both as content parts and as {named}", path)
        reasoning, named = thought, "thinking parts"
    legacy = turn.get("function_call")  # the OpenAI API's one call before tools
    calls = _calls_of(turn.get("tool_calls"))
    calls_field = "tool_calls" if calls else "function_call"  # the one a refusal names
    calls = calls or ([legacy] if legacy is not None else None)
    if content is None and (reasoning is not None or calls is not None):
        content = ""  # a call alone, or a server's answer cut off while it was still thinking
    if role is None or content is None:
        raise LabError(f"{where}: a turn lacks role/content (or from/value)", path)
    if not isinstance(role, str):  # its Python repr would name it, true as "True"
        raise LabError(f"{where}: a turn's role is {type(role).__name__}, not text", path)
    if role.lower() not in ROLES:
        raise LabError(f"{where}: unknown role {role!r} (known: {', '.join(sorted(ROLES))})", path)
    # A list is content parts where any item has a type; a tool's result of another list is a JSON value, an
    # empty one too: a template handed it writes "[]" (Llama 3.1's and GPT-OSS's `tojson`, Qwen2.5's text).
    parts = isinstance(content, list) and any(isinstance(c, dict) and "type" in c for c in content)
    role = ROLES[role.lower()]
    if role == "tool" and not (isinstance(content, str) or parts):
        content = json.dumps(content, ensure_ascii=False)  # a result stored as a JSON value: its text, as clients send it
    out = {"role": role, "content": _text_of(content, where, path, role)}
    if reasoning is not None:
        if out["role"] != "assistant":
            raise LabError(f"{where}: {_THINKING_RULE}: {named} on a {out['role']} turn", path)
        if reasoning:
            out["reasoning_content"] = reasoning
    if calls is not None:
        if out["role"] != "assistant" or not isinstance(calls, list):
            rule = "must be a list, on an assistant turn" if calls_field == "tool_calls" else "must be on an assistant turn"
            raise LabError(f"{where}: {calls_field} {rule}", path)
        out["tool_calls"] = [parse_call(c, where, path) for c in calls]
        if calls_field == "tool_calls" and legacy is not None:
            # Some exports mirror the first tool call in the old field: that one is the same call, read once
            mirrored = parse_call(legacy, where, path)["function"]
            if all(c["function"] != mirrored for c in out["tool_calls"]):
                raise LabError(f"{where}: function_call {mirrored['name']!r} is not one of the turn's tool_calls: "
                               "give a turn's calls in one of the two", path)
    if out["role"] == "tool":
        # Text, as the OpenAI API's tool message and SGLang's and vLLM's request models take them (a server
        # refuses a number); null is absent, as a table of both dialects writes it.
        for k in ("tool_call_id", "name"):
            if turn.get(k) is not None and not isinstance(turn[k], str):
                raise LabError(f"{where}: a tool turn's {k} is {type(turn[k]).__name__}, not text", path)
        out.update({k: turn[k] for k in ("tool_call_id", "name") if turn.get(k) is not None})
    ids = turn.get("token_ids")
    if ids is not None:
        if not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
            raise LabError(f"{where}: token_ids must be a list of token ids (integers >= 0)", path)
        out["token_ids"] = ids
        temperature = turn.get("temperature")
        if temperature is not None:
            if type(temperature) not in (int, float) or not 0 <= temperature < math.inf:  # JSON's Infinity too
                raise LabError(f"{where}: temperature must be a finite number >= 0", path)
            out["temperature"] = temperature
        fp = turn.get("target_fingerprint")
        if fp is not None:
            if not isinstance(fp, str):
                raise LabError(f"{where}: target_fingerprint must be text", path)
            out["target_fingerprint"] = fp
        prompted = turn.get("rendered_with")
        if prompted is not None:
            if not isinstance(prompted, dict):
                raise LabError(f"{where}: rendered_with must be an object", path)
            # chat.pinned passes over such a record: refused here, where the file is known
            if problem := recorded_kwargs_problem(prompted.get("chat_template_kwargs")):
                raise LabError(f"{where}: rendered_with's {problem}", path)
            out["rendered_with"] = prompted
    reason = turn.get("finish_reason")
    if reason is not None and out["role"] == "assistant":  # left out as before on other turns, which no server ends
        field = "finish_reason's type" if isinstance(reason, dict) else "finish_reason"
        reason = reason.get("type") if isinstance(reason, dict) else reason  # SGLang's native {"type": "length", ...}
        if not isinstance(reason, str):
            raise LabError(f"{where}: {field} must be text (\"stop\", \"length\")", path)
        out["finish_reason"] = reason
    return out


def _add_system(messages: list[dict], system, where: str, path) -> None:
    """A record's top-level `system` prompt as its leading system turn; records without one (or with
    an empty one) keep their turns, and so their ids, as they were."""
    if system is not None and not isinstance(system, str):
        raise LabError(f"{where}: top-level system is {type(system).__name__}, not text", path)
    if not system:
        return
    if messages and messages[0]["role"] in ("system", "developer"):  # developer: OpenAI's system turn
        if messages[0]["content"] != system:
            raise LabError(f"{where}: a top-level system prompt and a different leading {messages[0]['role']} "
                           "turn: keep one", path)
        return
    messages.insert(0, {"role": "system", "content": system})


def _utf8(blob: bytes, path) -> bytes:
    """A file's text as UTF-8 without a byte order mark: UTF-16 or UTF-32 (Windows tools write
    UTF-16 with a BOM) decoded, told apart as JSON itself is (RFC 8259: a BOM, or the zero bytes
    of its first characters)."""
    encoding = json.detect_encoding(blob[:4])
    if encoding == "utf-8":
        return blob  # as it was: each line is decoded as it is read
    if encoding == "utf-8-sig":
        return blob[len(codecs.BOM_UTF8):]
    try:
        return blob.decode(encoding).encode()
    except UnicodeError as e:
        raise LabError(f"looks like {encoding.upper()} text, but cannot be decoded as such ({e})", path) from None


def _rows(blob: bytes, path):
    """(where, row) of each row of a file's bytes: a jsonl line's object, or an array's item."""
    if blob.lstrip()[:1] == b"[":
        try:
            rows = json.loads(blob)
        except (ValueError, RecursionError) as e:
            raise LabError(f"begins with [ but is not one valid JSON array of conversations ({e})", path) from None
        yield from ((f"item {k}", row) for k, row in enumerate(rows, 1))
        return
    for lineno, raw in enumerate(blob.split(b"\n"), 1):
        if raw.strip():
            try:
                yield f"line {lineno}", json.loads(raw)
            except (ValueError, RecursionError) as e:  # also nesting too deep, or an integer of over 4300 digits
                raise LabError(f"line {lineno} is not valid JSON ({e})", path) from None


_UNREADABLE = {FileNotFoundError: "conversations file not found",
               IsADirectoryError: "conversations path is a directory, not a jsonl file",
               PermissionError: "conversations file is not readable (permission denied)"}
"""What a conversations path that cannot be read is, as its read and its hash say it."""


def _unreadable(e: OSError, path) -> LabError:
    """A conversations path whose read fails, in one line: as `_UNREADABLE` names it, else with the
    system's reason (a path through a file, a name too long)."""
    return LabError(_UNREADABLE.get(type(e)) or f"cannot read the conversations file ({e.strerror or e})", path)


def read_conversations(path, strict: bool = False, prompts: bool = False) -> tuple[list[Conversation], dict]:
    """Read a jsonl file (or a JSON array, gzip-compressed or not); returns (conversations, skipped
    counts by reason). `prompts`: the file is decoded from, not trained on, so a conversation without
    an assistant turn is kept (its turns are the prompt)."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise _unreadable(e, path) from None
    if blob[:2] == b"\x1f\x8b":
        try:
            blob = gzip.decompress(blob)
        except (OSError, EOFError, zlib.error) as e:
            raise LabError(f"gzip-compressed, but cannot be decompressed ({e})", path) from None
    blob = _utf8(blob, path)
    convs: list[Conversation] = []
    seen: dict[str, tuple[str, object]] = {}  # id -> where it was first, and as the file wrote it
    skipped: Counter = Counter()
    rows = 0
    for where, obj in _rows(blob, path):
        rows += 1
        # json.loads read obj from deeper in the stack, so dumps meets no recursion limit (nor an int too long
        # for text, which loads refuses): a surrogate is all that fails here.
        try:
            json.dumps(obj, ensure_ascii=False).encode()  # json takes a lone UTF-16 surrogate; no tokenizer does
        except UnicodeEncodeError as e:
            raise LabError(f"{where}: text holds an unpaired surrogate (\\u{ord(e.object[e.start]):04x})", path) from None
        if not isinstance(obj, dict):
            raise LabError(f"{where}: expected a JSON object, got {type(obj).__name__}", path)
        turns = _either(obj, "conversations", "messages")
        if not isinstance(turns, list):
            raise LabError(f"{where}: no `conversations` (or `messages`) list", path)
        messages = [_parse_turn(t, where, path) for t in turns]
        tools = _row_tools(obj, where, path)
        given = obj.get("id")
        # Written out (regenerated, journalled) the value would be no JSON; an id NaN named "nan".
        for what, value in (("id", given), ("tools", tools), *((f"turn {k}", m) for k, m in enumerate(messages, 1))):
            if (bad := _non_finite(value)) is not None:
                raise LabError(f"{where}: {what} has {json.dumps(bad)}, which is not a JSON number", path)
        if isinstance(given, (bool, list, dict)):  # its Python repr would name it: ["a"] as "['a']", true as "True"
            raise LabError(f"{where}: id is {type(given).__name__}, not text or a number", path)
        _add_system(messages, obj.get("system"), where, path)
        if not prompts and not any(m["role"] == "assistant" for m in messages):
            if strict:
                raise LabError(f"{where}: conversation has no assistant turn (--strict)", path)
            skipped["no_assistant_turn"] += 1
            continue
        if isinstance(given, str) and not given.strip():
            given = None  # an empty id names nothing (SpecForge data carries some): the content hash names it
        cid = str(given) if given is not None else content_id(messages, tools)
        if cid in seen:
            first, before = seen[cid]
            if None not in (given, before) and json.dumps(given) != json.dumps(before):
                raise LabError(f"{where}: id {json.dumps(given)} and {first}'s id {json.dumps(before)} are the same as text; "
                               "give the two conversations distinct ids", path)
            skipped["duplicate_id"] += 1
            continue
        seen[cid] = (where, given)
        convs.append(Conversation(id=cid, messages=messages, tools=tools))
    if not rows:  # an empty file, blank lines or `[]`: said so, not as "no conversation with an assistant turn"
        raise LabError("holds no conversations", path)
    return convs, dict(skipped)


def conversations_sha256(path) -> str:
    """The hash that keys work made from a conversations file (a capture's manifest, a regeneration's
    cache and journal): of the bytes a gzip-compressed file holds, so that compressing the same
    conversations otherwise (another level or tool, or not at all) resumes that work; of the file's
    own bytes otherwise, as it always was."""
    try:  # a file moved while a target loaded, or a run trained, is named as its read names it
        with open(path, "rb") as f:
            packed = f.read(2) == b"\x1f\x8b"
    except OSError as e:
        raise _unreadable(e, path) from None
    if not packed:
        return atomic.sha256_file(path)
    h = hashlib.sha256()
    try:
        with gzip.open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except (OSError, EOFError, zlib.error) as e:
        raise LabError(f"gzip-compressed, but cannot be decompressed ({e})", path) from None
    return h.hexdigest()


def write_conversations(path, convs: list[Conversation]) -> None:
    """Write SpecForge-style jsonl (`id`, `tools` where there are some, `conversations` with
    role/content), atomically."""
    lines = [json.dumps(c.record(), ensure_ascii=False) for c in convs]
    with atomic.atomic_path(path) as tmp:
        tmp.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
