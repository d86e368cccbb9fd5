"""Incremental detokenisation for a byte-level BPE tokenizer (Qwen2/Qwen3, MODEL.md 5.4 and 6).

A token is a run of UTF-8 bytes, not of characters: one CJK character (3 bytes) is often split
over two tokens. The detokenizer keeps the bytes of a character until it is complete, so it
never emits half a character or a spurious U+FFFD, and the concatenation of everything it
emits equals `tokenizer.decode(all_ids)` (special tokens skipped).
"""

from __future__ import annotations

import codecs

from tokenizers import Tokenizer, decoders

from livemeet.errors import ConfigError


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: vocabulary character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_OF_CHAR = _byte_decoder()


class IncrementalDetokenizer:
    """Turns generated token ids into text, one id at a time.

    `push(token_id)` returns the text that became complete (possibly ""); `flush()` returns
    whatever is left at the end (an unfinished character becomes U+FFFD, as in `decode`).
    Special tokens (`<|im_end|>`, `<|endoftext|>`, ...) are skipped; non-special added tokens
    (`<think>`) give their text. Ids with no token (the model's embedding has 151,936 rows, the
    vocabulary 151,672 ids: MODEL.md section 4) give no text, like `Tokenizer.decode`, and are
    counted in `num_unknown_ids`. Raises ConfigError for a tokenizer without a ByteLevel decoder.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        if not isinstance(tokenizer.decoder, decoders.ByteLevel):
            raise ConfigError("IncrementalDetokenizer needs a byte-level BPE tokenizer")
        self._tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self._special = frozenset(i for i, t in added.items() if t.special)
        self._added_bytes = {i: t.content.encode() for i, t in added.items() if not t.special}
        self._bytes_cache: dict[int, bytes] = {}
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.num_unknown_ids = 0

    def push(self, token_id: int) -> str:
        """Add one generated id; return the newly complete text."""
        if token_id in self._special:
            return ""
        return self._utf8.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """End of generation: return the remaining text and reset for reuse."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text

    def _token_bytes(self, token_id: int) -> bytes:
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        if token_id in self._added_bytes:
            raw = self._added_bytes[token_id]
        else:
            piece = self._tokenizer.id_to_token(token_id)
            if piece is None:
                # A padding row of the embedding: sampling it is a model fault, not a reason to
                # crash the worker that serves every other session.
                self.num_unknown_ids += 1
                return b""
            raw = bytes(_BYTE_OF_CHAR[c] for c in piece)
        self._bytes_cache[token_id] = raw
        return raw
