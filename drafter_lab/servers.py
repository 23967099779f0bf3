"""What the lab's requests to an SGLang or vLLM server share: plain sampling, and the served name.

A server fills each sampling knob a request leaves unset from the model's generation_config.json
(vLLM's default `--generation-config auto`, SGLang's model sampling defaults): Qwen2.5's top-k 20,
top-p 0.8 and repetition penalty 1.05 would reshape every answer, greedy ones too. The lab's own
decoding, its regeneration and its predictions of a sampled server are the plain argmax or
softmax(logits / T), so every request (`data regenerate --server`, `eval --server`) sets each knob
to its neutral value, by the names both servers take in their OpenAI-compatible and native APIs.

vLLM answers only to the name it serves a model under (SGLang takes any), which `/v1/models`
lists on both.
"""

from __future__ import annotations

from drafter_lab.errors import LabError
from drafter_lab.httpjson import request_json

PLAIN = {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
         "presence_penalty": 0.0}
"""Neutral values (top_k -1: every token)."""


def served_model(url: str, timeout_s: float, retries: int) -> str:
    """The first model the server at `url` lists; a server that lists none is a LabError naming it."""
    endpoint = url.rstrip("/") + "/v1/models"
    models = request_json(endpoint, timeout_s=timeout_s, retries=retries)
    try:
        return str(models["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise LabError("lists no model; pass --model", endpoint) from None
