"""Byte-level BPE tokenizer trained with the `tokenizers` library, saved in HF format."""

from __future__ import annotations

from collections.abc import Iterable

from drafter_lab.targets.hf import DEFAULT_CHAT_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_bpe(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE on `texts`; returns a `PreTrainedTokenizerFast` with a chat template.

    `<|im_end|>` ends an assistant turn and is the eos token; `<|endoftext|>` pads.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = DEFAULT_CHAT_TEMPLATE
    return fast
