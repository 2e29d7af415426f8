"""Natural texts of an exact token count, cut from the shipped corpus with the model's tokenizer.

The paper's workload is "queries of L tokens". A text is built from randomly chosen corpus
sentences joined by spaces, the last one cut at a word boundary so that the whole text
encodes to exactly L ids, special tokens included; every text is re-encoded and checked.
Random sentence order makes repeats rare, so an embedding cache in the server sees mostly
distinct texts, as in RAG traffic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer

from windve.model import bundled_model_path, resolve_model_path
from windve.tokenizer import load_fast_tokenizer

MAX_ATTEMPTS = 100  # whole-text retries before giving up on a tokenizer that is not additive
MAX_DRAWS = 1000  # sentence draws per attempt


@dataclass(frozen=True)
class _Sentence:
    text: str
    tokens: int  # without special tokens
    cut_ends: dict[int, int]  # k -> character end of the first k tokens, where a word ends


def corpus_sentences() -> list[str]:
    """The shipped corpus: one sentence per line; '#' comments and blank lines skipped."""
    text = resources.files("loadtest").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def load_tokenizer(source: str | None = None) -> Tokenizer:
    """A tokenizer.json file, a model folder, a cached model id, or (None) the bundled model's."""
    if source is None:
        path = bundled_model_path()
    elif Path(source).is_file():
        path = Path(source)
    else:
        _, path = resolve_model_path(source)
    tokenizer = Tokenizer.from_file(str(path)) if path.is_file() else load_fast_tokenizer(path)
    # Model files often ship fixed padding/truncation (all-MiniLM-L6-v2 pads to 128): off, to count.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class ExactLengthTexts:
    """Draws texts whose encoding is exactly `tokens` ids long, special tokens included."""

    def __init__(self, tokenizer: Tokenizer, tokens: int, sentences: Sequence[str]) -> None:
        self.tokens = tokens
        self._tokenizer = tokenizer
        post = tokenizer.post_processor
        specials = post.num_special_tokens_to_add(False) if post is not None else 0
        self._content = tokens - specials
        if self._content < 1:
            raise ValueError(f"{tokens} tokens leave no room for text next to {specials} special tokens")
        encodings = tokenizer.encode_batch(list(sentences), add_special_tokens=False)
        self._sentences = [_describe(text, enc) for text, enc in zip(sentences, encodings) if enc.ids]
        if not self._sentences:
            raise ValueError("the corpus has no sentences")

    def length(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def sample(self, rng: random.Random) -> str:
        drawn = False
        for _ in range(MAX_ATTEMPTS):
            text = self._draw(rng)
            drawn = drawn or text is not None
            if text is not None and self.length(text) == self.tokens:
                return text
        if not drawn:
            raise ValueError(
                f"{self.tokens} tokens is more text than {MAX_DRAWS} sentences of the corpus make; "
                "a model takes 512 tokens or so at most, and the server refuses longer texts"
            )
        raise RuntimeError(
            f"could not build a {self.tokens}-token text from the corpus with this tokenizer "
            f"in {MAX_ATTEMPTS} attempts; is it a word-level tokenizer (BERT/XLM-R style)?"
        )

    def sample_many(self, count: int, rng: random.Random) -> list[str]:
        return [self.sample(rng) for _ in range(count)]

    def _draw(self, rng: random.Random) -> str | None:
        parts: list[str] = []
        need = self._content
        for _ in range(MAX_DRAWS):
            sentence = rng.choice(self._sentences)
            if sentence.tokens <= need:
                parts.append(sentence.text)
                need -= sentence.tokens
            elif need in sentence.cut_ends:
                parts.append(sentence.text[: sentence.cut_ends[need]])
                need = 0
            if need == 0:
                # Whitespace splits words for BERT-family pre-tokenizers, so token counts add up.
                return " ".join(parts)
        return None


def _describe(text: str, encoding) -> _Sentence:  # noqa: ANN001 - tokenizers.Encoding
    words = encoding.word_ids
    offsets = encoding.offsets
    count = len(encoding.ids)
    cut_ends = {
        k: offsets[k - 1][1]
        for k in range(1, count + 1)
        if k == count or words[k] is None or words[k] != words[k - 1]
    }
    return _Sentence(text, count, cut_ends)


@lru_cache(maxsize=8)
def text_source(tokenizer: str | None, tokens: int) -> ExactLengthTexts:
    """One builder per (tokenizer, length) per process, shared by all simulated users; it has
    built one text, so that a length it cannot build fails here, not in every user."""
    texts = ExactLengthTexts(load_tokenizer(tokenizer), tokens, corpus_sentences())
    texts.sample(random.Random(0))
    return texts
