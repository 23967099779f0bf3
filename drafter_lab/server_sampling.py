"""The sampling knobs every request to an SGLang or vLLM server sets, so that it samples plainly.

A server fills each knob a request leaves unset from the model's generation_config.json (vLLM's
default `--generation-config auto`, SGLang's model sampling defaults): Qwen2.5's top-k 20, top-p 0.8
and repetition penalty 1.05 would reshape every answer, greedy ones too. The lab's own decoding, its
regeneration and its predictions of a sampled server are the plain argmax or softmax(logits / T),
so every request (`data regenerate --server`, `eval --server`) sets each knob to its neutral value,
by the names both servers take in their OpenAI-compatible and native APIs.
"""

PLAIN = {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
         "presence_penalty": 0.0}
"""Neutral values (top_k -1: every token)."""
