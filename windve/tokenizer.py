"""Batch tokenization with the model's fast tokenizer, and exact-length query building."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, normalizers

from windve.bert_wordpiece import BertWordPiece
from windve.model import ModelError, ModelSpec

FILLER_TEXT = (
    "Retrieval augmented generation systems embed questions and passages into vectors so that "
    "a nearest neighbour search can find the passages that answer a question. The embedding "
    "service must keep its latency low while many users ask at once, and it should use every "
    "processor of the server it runs on, the accelerator first and the idle CPU cores when a "
    "burst arrives. "
)

# Characters tokenized at once when counting: bounds the memory a huge text costs while counted.
COUNT_CHUNK_CHARS = 64 * 1024
_LAST_SPACE = re.compile(r"\s\S*\Z")


class InputTooLong(ValueError):
    def __init__(self, index: int, tokens: int, limit: int, at_least: bool = False) -> None:
        counted = f"at least {tokens}" if at_least else f"{tokens}"
        super().__init__(
            f"input {index} has {counted} tokens, more than the model's limit of {limit}; "
            "shorten it or send truncate=true"
        )
        self.index, self.tokens, self.limit, self.at_least = index, tokens, limit, at_least

    def at(self, index: int) -> InputTooLong:
        """The same, said of input `index` of the request (this one's index is within a part of it)."""
        return InputTooLong(index, self.tokens, self.limit, self.at_least)


class NotInVocabulary(ValueError):
    """A token id past the model's vocabulary: an engine would index past its embedding table."""


class TextTokenizer:
    """Texts -> int32 token-id arrays, special tokens included, at most `max_tokens` long."""

    def __init__(self, spec: ModelSpec, max_tokens: int | None = None) -> None:
        self.max_tokens = min(spec.max_seq_length, max_tokens or spec.max_seq_length)
        self._spec = spec
        self._tokenizer = self._truncating(spec.truncation_side)
        self._other: Tokenizer | None = None  # truncating at the other side, made when first asked
        self._full = load_fast_tokenizer(spec.path, spec.lower_case)
        self._full.no_padding()
        self._full.no_truncation()
        post = self._full.post_processor
        self._specials_per_text = post.num_special_tokens_to_add(False) if post is not None else 0
        # Exact ids at a quarter to a sixth of the cost where the model's tokenizer is BERT's (bert_wordpiece.py).
        self._fast = BertWordPiece.for_tokenizer(self._full, self.max_tokens)

    @property
    def fast_path(self) -> str | None:
        """The path that tokenizes what it can before tokenizers (for /info): "bert-wordpiece" or None."""
        return "bert-wordpiece" if self._fast is not None else None

    def _truncating(self, side: str) -> Tokenizer:
        tokenizer = load_fast_tokenizer(self._spec.path, self._spec.lower_case)
        tokenizer.no_padding()
        # Truncation keeps the special tokens; `overflowing` tells that it happened.
        tokenizer.enable_truncation(self.max_tokens, direction=side)
        return tokenizer

    def encode(self, texts: Sequence[str], truncate: bool, side: str | None = None) -> list[np.ndarray]:
        """Token ids per text; raises InputTooLong for the first over-long text when not truncating.
        `side`: where a long text is cut, `left` or `right` (None: the model's tokenizer's side)."""
        side = self._spec.truncation_side if side is None else side
        # (ids, overflowed) per text: the fast path's where it takes the text, else the tokenizer's.
        encoded: list[tuple[list[int], bool] | None] = [None] * len(texts)
        if self._fast is not None:
            for index, text in enumerate(texts):
                encoded[index] = self._fast.encode(text, side)
        rest = [index for index, done in enumerate(encoded) if done is None]
        if rest:
            tokenizer = self._tokenizer
            if side != self._spec.truncation_side:
                if self._other is None:  # two threads may both make it: the same tokenizer either way
                    self._other = self._truncating(side)
                tokenizer = self._other
            encodings = tokenizer.encode_batch_fast([texts[index] for index in rest], add_special_tokens=True)
            for index, encoding in zip(rest, encodings):
                encoded[index] = (encoding.ids, bool(encoding.overflowing))
        sequences = []
        for index, (ids, overflowed) in enumerate(encoded):  # type: ignore[misc]
            if overflowed and not truncate:
                # Counted in bounded pieces, which let go of the interpreter lock: a whole 2 MB
                # text in one encode held it 4 s, and /health waited behind it.
                text = texts[index]
                counted = self.count_tokens([text], add_special_tokens=True, stop_above=self.max_tokens)
                raise InputTooLong(index, counted, self.max_tokens, at_least=len(text) > COUNT_CHUNK_CHARS)
            sequences.append(np.asarray(ids, dtype=np.int32))
        return sequences

    def tokens(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[dict]]:
        """Every token of each text, untruncated, in TEI's `/tokenize` shape.

        `start`/`stop` are character offsets into the text (None for special tokens), and `text`
        is the text they cover, or the special token itself.
        """
        encodings = self._full.encode_batch(list(texts), add_special_tokens=add_special_tokens)  # with offsets
        return [
            [
                {
                    "id": token_id,
                    "text": token if special else text[start:stop],
                    "special": bool(special),
                    "start": None if special else start,
                    "stop": None if special else stop,
                }
                for token_id, token, special, (start, stop) in zip(
                    encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
                )
            ]
            for text, encoding in zip(texts, encodings)
        ]

    def count_tokens(self, texts: Sequence[str], add_special_tokens: bool, stop_above: int) -> int:
        """How many tokens `tokens` would answer, in pieces of bounded size, stopping past `stop_above`.

        Once the count passes `stop_above` it is returned at once, so a huge text costs a fraction of
        its full tokenization and one piece's memory. Texts are cut at whitespace between pieces,
        which can move the count by a token or so at each cut: an estimate for refusing early.
        """
        specials = self._specials_per_text * len(texts) if add_special_tokens else 0
        total = specials
        for pieces in _pieces(texts, COUNT_CHUNK_CHARS):
            encodings = self._full.encode_batch_fast(pieces, add_special_tokens=False)
            total += sum(len(encoding.ids) for encoding in encodings)
            if total > stop_above:
                break
        return total

    def sequence_of_ids(self, ids: Sequence[int], truncate: bool, side: str | None = None) -> np.ndarray:
        """Token ids a client sent, taken as they are (no special tokens added, as TEI takes them),
        cut to `max_tokens` at `side` when truncating; InputTooLong (its index 0) when not, and
        NotInVocabulary for an id the model does not have."""
        past = self.past_vocabulary(ids)
        if past is not None:
            vocabulary = self.vocabulary_size
            raise NotInVocabulary(f"token id {ids[past]} is past this model's vocabulary (0 to {vocabulary - 1})")
        sequence = np.asarray(ids, dtype=np.int32)
        if len(sequence) > self.max_tokens:
            if not truncate:
                raise InputTooLong(0, len(sequence), self.max_tokens)
            side = self._spec.truncation_side if side is None else side
            sequence = sequence[-self.max_tokens :] if side == "left" else sequence[: self.max_tokens]
        return sequence

    def past_vocabulary(self, ids: Sequence[int]) -> int | None:
        """Where the first id past the model's vocabulary is in `ids` (None: nowhere). Checked as
        Python ints, before numpy sees them: an id read from JSON may pass 64 bits."""
        vocabulary = self.vocabulary_size
        if max(ids, default=0) < vocabulary:
            return None
        return next(index for index, token in enumerate(ids) if token >= vocabulary)

    @property
    def vocabulary_size(self) -> int:
        """Token ids run from 0 to this, added tokens included."""
        return self._full.get_vocab_size(with_added_tokens=True)

    def decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        """The text of each sequence of token ids (TEI's `/decode`)."""
        return self._full.decode_batch([list(ids) for ids in sequences], skip_special_tokens=skip_special_tokens)

    def text_of_tokens(self, tokens: int) -> str:
        """A natural text whose encoding is exactly `tokens` ids long (special tokens included)."""
        if tokens < 2 or tokens > self.max_tokens:
            raise ValueError(f"query length must be between 2 and {self.max_tokens} tokens, not {tokens}")
        words = (FILLER_TEXT * (1 + tokens // 40)).split()
        low, high = 0, len(words)
        # Longest word prefix that fits, then pad with single-token words to the exact length.
        while low < high:
            mid = (low + high + 1) // 2
            if len(self._full.encode(" ".join(words[:mid])).ids) <= tokens:
                low = mid
            else:
                high = mid - 1
        text = " ".join(words[:low])
        while len(self._full.encode(text).ids) < tokens:
            text += " a"
        return text

    def make_query(self, tokens: int) -> np.ndarray:
        return self.encode([self.text_of_tokens(tokens)], truncate=False)[0]


def _pieces(texts: Sequence[str], size: int) -> Iterator[list[str]]:
    """The texts, in order, in lists of at most about `size` characters; long texts cut at whitespace."""
    batch: list[str] = []
    held = 0
    for piece in _cut(texts, size):
        if batch and held + len(piece) > size:
            yield batch
            batch, held = [], 0
        batch.append(piece)
        held += len(piece)
    if batch:
        yield batch


def _cut(texts: Sequence[str], size: int) -> Iterator[str]:
    for text in texts:
        start = 0
        while len(text) - start > size:
            end = start + size
            # Cutting inside a word would count it as two; a text without whitespace is cut anyway.
            space = _LAST_SPACE.search(text, start + size // 2, end)
            cut = space.start() if space else end
            yield text[start:cut]
            start = cut
        yield text[start:]


# What a tokenizer is built from, by the tokenizer families transformers converts to a fast one.
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
)


def load_fast_tokenizer(path: Path, lower_case: bool = False) -> Tokenizer:
    """The model's fast tokenizer; with `lower_case` (the model's do_lower_case), lowercasing
    first, as sentence-transformers puts a Lowercase in front of the tokenizer's normalizer (it
    had been ignored: a cased vocabulary then embedded "What" as itself, not as "what")."""
    tokenizer_file = Path(path) / "tokenizer.json"
    # tokenizers raises a bare Exception ("expected value at line 1 column 1") naming no file; a
    # start that fails on it must say which file of which model.
    if tokenizer_file.is_file():
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as error:  # noqa: BLE001 - tokenizers' errors are plain Exceptions
            raise ModelError(f"model folder {path}: tokenizer.json is not a tokenizer: {error}") from None
    else:
        # transformers 5 builds a BertTokenizer of 5 special tokens from a folder with no
        # vocabulary at all: every word then embeds as [UNK], a wrong vector, not an error.
        if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
            raise ModelError(f"model folder {path} has no tokenizer: none of {', '.join(TOKENIZER_FILES)}")
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True).backend_tokenizer
        except Exception as error:  # noqa: BLE001 - transformers raises OSError, ValueError, TypeError...
            raise ModelError(f"model folder {path} has no tokenizer.json, and no other tokenizer loads: {error}") \
                from None
    if lower_case:
        present = tokenizer.normalizer
        steps = [] if present is None else list(present) if isinstance(present, normalizers.Sequence) else [present]
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *steps])
    return tokenizer
