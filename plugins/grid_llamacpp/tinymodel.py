"""A deterministic tiny llama-architecture GGUF for tests and the demo.

The weights are random (seeded), the tokenizer is a real SentencePiece-style vocabulary with
byte fallback, so ``llama-server`` loads the file, tokenizes any text and generates tokens.
The output is gibberish by design; what matters is that the whole serving path is real and
that the file has a real, controllable size for memory admission.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grid_core.api import ValidationError, replace_durably

MIN_EMBEDDING = 16
"""Smallest embedding width: four heads of four dimensions each."""
MAX_EMBEDDING = 4096
"""Largest embedding width accepted: already hundreds of MB per layer pair, beyond a test."""
MAX_LAYERS = 64
"""Layer ceiling; tens of MB come from width, not depth."""
MIN_CONTEXT = 64
"""Smallest context that still fits a chat template plus a few generated tokens."""
MAX_CONTEXT = 32768
"""Context ceiling; the KV cache of a tiny model stays small even there."""
HEAD_DIM = 16
"""Per-head width; a power of two that divides every accepted embedding width (multiples of 16)."""
FFN_MULTIPLIER = 2
"""Feed-forward width as a multiple of the embedding width (llama ~2.7; 2 keeps files small)."""
WORD_PIECES = (
    "the",
    "a",
    "to",
    "of",
    "and",
    "is",
    "in",
    "it",
    "you",
    "that",
    "hello",
    "world",
    "ok",
    "grid",
    "model",
    "reply",
    "with",
    "yes",
    "no",
    "Reply",
    "OK",
    "Hello",
)
"""A few whole-word pieces so common prompts do not fall back to bytes entirely."""
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""A ChatML template so ``/v1/chat/completions`` works against the tiny model."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a generated model.

    Attributes:
        name: ``general.name`` written into the file.
        layers: transformer blocks (1..MAX_LAYERS).
        embedding: embedding width, a multiple of 16 (MIN_EMBEDDING..MAX_EMBEDDING).
        context: trained context length in tokens.
        seed: random seed; the same spec always yields the same bytes.
    """

    name: str = "grid-tiny"
    layers: int = 2
    embedding: int = 64
    context: int = 512
    seed: int = 0

    def validate(self) -> None:
        """Raise ValidationError naming the bad field and the accepted range."""
        if not 1 <= self.layers <= MAX_LAYERS:
            msg = f"--layers {self.layers}: use 1..{MAX_LAYERS}"
            raise ValidationError(msg)
        if not MIN_EMBEDDING <= self.embedding <= MAX_EMBEDDING or self.embedding % HEAD_DIM:
            msg = (
                f"--embedding {self.embedding}: use a multiple of {HEAD_DIM} in "
                f"{MIN_EMBEDDING}..{MAX_EMBEDDING}"
            )
            raise ValidationError(msg)
        if not MIN_CONTEXT <= self.context <= MAX_CONTEXT:
            msg = f"--context {self.context}: use {MIN_CONTEXT}..{MAX_CONTEXT}"
            raise ValidationError(msg)
        if not self.name or len(self.name) > 200:
            msg = "--name must be 1..200 characters"
            raise ValidationError(msg)


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a SentencePiece vocabulary with byte fallback."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [2, 3, 3, 3, 3]  # unknown, then control tokens
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # byte tokens
    pieces = ["\u2581"] + [f"\u2581{w}" for w in WORD_PIECES] + list("abcdefghijklmnopqrstuvwxyz")
    tokens += pieces
    types += [1] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def make_model(out: Path, spec: TinyModelSpec) -> int:
    """Write a tiny llama GGUF to ``out`` atomically.

    Args:
        out: destination path (parent directories are created).
        spec: model shape; validated first.

    Returns:
        The file size in bytes.

    Raises:
        ValidationError: a shape field is out of range.
    """
    import gguf

    spec.validate()
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = _vocabulary()
    n_vocab, n_embd = len(tokens), spec.embedding
    n_head = n_embd // HEAD_DIM
    n_ff = n_embd * FFN_MULTIPLIER
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    try:
        writer.add_name(spec.name)
        writer.add_context_length(spec.context)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(spec.layers)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(4)  # <|im_end|> ends a chat turn
        writer.add_add_bos_token(True)
        writer.add_chat_template(CHAT_TEMPLATE)

        def weight(*shape: int) -> np.ndarray:
            scale = 1.0 / np.sqrt(shape[-1])
            return (rng.standard_normal(shape) * scale).astype(np.float16)

        def norm() -> np.ndarray:
            return np.ones(n_embd, dtype=np.float32)

        # numpy shapes are the reverse of ggml's ne order that llama.cpp checks.
        writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
        for i in range(spec.layers):
            p = f"blk.{i}"
            writer.add_tensor(f"{p}.attn_norm.weight", norm())
            writer.add_tensor(f"{p}.attn_q.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"{p}.attn_k.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"{p}.attn_v.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"{p}.attn_output.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"{p}.ffn_norm.weight", norm())
            writer.add_tensor(f"{p}.ffn_gate.weight", weight(n_ff, n_embd))
            writer.add_tensor(f"{p}.ffn_up.weight", weight(n_ff, n_embd))
            writer.add_tensor(f"{p}.ffn_down.weight", weight(n_embd, n_ff))
        writer.add_tensor("output_norm.weight", norm())
        writer.add_tensor("output.weight", weight(n_vocab, n_embd))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    try:
        replace_durably(tmp, out)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return out.stat().st_size
