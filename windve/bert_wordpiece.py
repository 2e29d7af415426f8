"""BERT WordPiece token ids, the same as the model's tokenizer gives, at a quarter to a sixth of its cost.

tokenizers spends ~100 us on one 75-token query on a 2-core EPYC host (bench/SERVED.md), more than
a third of a front end's time per request where the front ends set the rate; 40 % of it goes to the
normalizer, which keeps an alignment of every byte for offsets that embedding never reads. On ASCII
text the BERT normalizer and pre-tokenizer come down to three rules: drop control characters (tab,
newline and carriage return are whitespace), lowercase when the model does, and split at whitespace
and around every punctuation character. This module applies them with one regular expression and
takes each word's ids from the tokenizer's own WordPiece model, remembered per word (queries repeat
their words): ~18 us for the same query, the ids equal.

Past ASCII, the characters that text copied from the web or a PDF holds (accented Latin letters,
combining accents, curly quotes, dashes, no-break and thin spaces, currency signs: `CANDIDATES`)
are learned at load from the tokenizer's own normalizer and pre-tokenizer, one character at a time
(`_learn`): what each becomes, and whether it is part of a word or punctuation. A text holding them
is mapped by that table and split the same way: ~27 us for the same query with a few of them,
against ~100 through tokenizers.

It serves a tokenizer only when its pipeline is exactly that one (normalizer, pre-tokenizer, model,
a post-processor that puts fixed tokens around one text) and it agrees with the tokenizer on probe
texts at load. A text holding a character it did not learn (CJK, Greek, emoji, ...), or an added
token's content in any case, before or after normalizing (`[MASK]` in a query is one token to the
tokenizer), or that is longer than `MAX_CHARS`, is left to the tokenizer.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# Longer texts go to the tokenizer, which releases the interpreter lock while it works: a thread
# tokenizing a large request here would hold it against the event loop.
MAX_CHARS = 16_384
WORDS_REMEMBERED = 1 << 16  # a query's words are mostly among the recent ones
# Longer words are not remembered, so the memory stays bounded (~10 MB) whatever clients send.
LONGEST_REMEMBERED = 64

# The BERT normalizer's clean_text drops these (control characters other than tab, newline, CR).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Every printable ASCII character that is not a letter, digit or space is punctuation to BERT
# (`_` included, unlike \w).
_ASCII_PUNCTUATION = r"!-/:-@\[-`{-~"
# BertPreTokenizer on ASCII: runs of letters and digits; each punctuation character alone;
# whitespace separates.
_WORD = re.compile(f"[A-Za-z0-9]+|[{_ASCII_PUNCTUATION}]")

# Characters past ASCII that the path learns from the tokenizer itself at load (`_learn`): accented
# Latin letters, combining accents, typographic punctuation and spaces, currency signs. Documents
# and queries copied from the web or from PDFs hold them (curly quotes, dashes, no-break spaces,
# accented names), and one of them sent the whole text to the tokenizer.
CANDIDATES = (
    *range(0x80, 0x250),  # Latin-1 Supplement, Latin Extended-A and -B
    *range(0x300, 0x370),  # combining diacritical marks
    *range(0x2000, 0x2070),  # general punctuation: spaces, dashes, quotes, bullets, ellipsis
    *range(0x20A0, 0x20D0),  # currency signs
)

_PROBES = (
    "Retrieval augmented generation systems embed questions and passages into vectors.",
    "What's the U.S.A.'s GDP, in 2023? $27.36 trillion -- roughly; see e.g. [1] & {x: y_z}.",
    "tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeeds\x1fand\x00nulls\x7fdeleted between letters",
    "CamelCase UPPER lower MiXeD 3.14159 0x1F 1,000,000 snake_case kebab-case path/to/file.txt",
    "a" * 150 + " antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "  leading and trailing spaces   ",
    " ".join(f"word{n}" for n in range(400)),
)
# Probes of the learned characters; one holding a character the tokenizer's table left out is not
# taken by the path, and not compared.
_WIDE_PROBES = (
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u2014 \u201cna\u00efve\u201d r\u00e9sum\u00e9s\u2026 "
    "it\u2019s \u00a35 or \u20ac5\u00a0only",
    "\u00c5NGSTR\u00d6M \u00df \u0130stanbul \u00c6sir \u0152uvre e\u0301 \u00bd\u00b2 \u00a9\u00ae "
    "\u2022 \u00b7 \u00bf\u00a1 \u2013 \u2010",
    "zero\u200bwidth\u200c\u200djoiners\u2060and\u2028separators\u2029and\u00adsoft\u00a0hyphens\u202f\u2009thin",
)


class WordPieceIds(NamedTuple):
    """A text's ids, special tokens included, cut to the limit; `overflowed`: it had to be cut."""

    ids: list[int]
    overflowed: bool


class BertWordPiece:
    """The fast path for one tokenizer; make it with `for_tokenizer`."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        lowercase: bool,
        max_tokens: int,
        specials: tuple[list[int], list[int]],
        learned: LearnedCharacters,
    ) -> None:
        model = tokenizer.model
        self.max_tokens = max_tokens
        self._lowercase = lowercase
        self._learned = learned
        self._prefix, self._suffix = specials
        self._room = max_tokens - len(self._prefix) - len(self._suffix)
        contents = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        self._added = re.compile("|".join(map(re.escape, contents)), re.IGNORECASE) if contents else None

        def ids_of(word: str) -> tuple[int, ...]:
            return tuple(token.id for token in model.tokenize(word))

        self._ids_of = ids_of
        self._remembered = functools.lru_cache(maxsize=WORDS_REMEMBERED)(ids_of)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, max_tokens: int) -> BertWordPiece | None:
        """The fast path for `tokenizer`, cutting texts at `max_tokens`; None when the tokenizer's
        pipeline is another one or the fast path does not match it on every probe text."""
        serialized = tokenizer.to_str()
        lowercase = _bert_lowercase(json.loads(serialized))
        if lowercase is None:
            return None
        # One copy, uncut and unpadded, finds the specials and then checks the probes.
        reference = Tokenizer.from_str(serialized)
        reference.no_padding()
        reference.no_truncation()
        specials = _specials_around(reference)
        if specials is None:
            return None
        fast = cls(tokenizer, lowercase, max_tokens, specials, _learn(reference))
        if fast._room < 1:
            return None
        for side in ("right", "left"):
            reference.enable_truncation(max_tokens, direction=side)
            for text in (*_PROBES, *_WIDE_PROBES):
                expected = reference.encode(text)
                got = fast.encode(text, side)
                if got is None and text in _WIDE_PROBES:
                    continue  # a character this tokenizer's table left out: the tokenizer takes the text
                if got is None or got.ids != expected.ids or got.overflowed != bool(expected.overflowing):
                    log.warning("the BERT WordPiece fast path differs from the tokenizer on %r: not used", text[:60])
                    return None
        return fast

    def encode(self, text: str, side: str) -> WordPieceIds | None:
        """`text`'s ids, cut at `side` (`left` or `right`) past `max_tokens`; None for a text this
        path leaves to the tokenizer."""
        if len(text) > MAX_CHARS or self._holds_added(text):
            return None
        splitter, normalized = _WORD, False
        if not text.isascii():
            learned = self._learned
            if learned.unknown.search(text):
                return None
            text, mapped = learned.mapped.subn(learned.normalized, text)
            splitter, normalized = learned.word, mapped > 0
        if _CONTROL.search(text):
            text, normalized = _CONTROL.sub("", text), True
        if normalized and self._holds_added(text):  # an added token matched on the normalized text
            return None
        if self._lowercase:
            text = text.lower()  # what it holds past ASCII is the normalizer's output: lowercase already
        words = splitter.findall(text)
        remembered, ids_of = self._remembered, self._ids_of
        content: list[int] = []
        for word in words:
            content += remembered(word) if len(word) <= LONGEST_REMEMBERED else ids_of(word)
        overflowed = len(content) > self._room
        if overflowed:
            content = content[-self._room :] if side == "left" else content[: self._room]
        return WordPieceIds(self._prefix + content + self._suffix, overflowed)

    def _holds_added(self, text: str) -> bool:
        return self._added is not None and self._added.search(text) is not None


class LearnedCharacters(NamedTuple):
    """What the tokenizer's normalizer and pre-tokenizer do with the characters past ASCII that the
    path takes: `mapped` finds those the normalizer changes, `normalized` (for `mapped.sub`) says
    into what (nothing: dropped); `word` finds the pre-tokenizer's words in a normalized text;
    `unknown` finds a character the path leaves to the tokenizer."""

    mapped: re.Pattern[str]
    normalized: Callable[[re.Match[str]], str]
    word: re.Pattern[str]
    unknown: re.Pattern[str]


def _learn(tokenizer: Tokenizer) -> LearnedCharacters:
    """Ask `tokenizer`'s own normalizer and pre-tokenizer about each candidate character, one at a
    time: both work a character at a time (BERT's normalizer maps each, its accent stripping drops
    every combining mark it makes, and its pre-tokenizer splits at whitespace and around
    punctuation), so a text's result is its characters' put together. A character is taken when
    the normalizer makes it ASCII, nothing, or one character past ASCII that it leaves as it is and
    that the pre-tokenizer keeps in a word or puts alone (punctuation); the probes at load and a
    property test hold the whole to the tokenizer. `tokenizer` is one `_bert_lowercase` took, so it
    has both stages."""
    normalizer, pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    table: dict[str, str] = {}
    known, word_chars, punctuation = [], set(), set()
    for code in CANDIDATES:
        char = chr(code)
        normalized = normalizer.normalize_str(char)
        if not normalized.isascii():
            if len(normalized) != 1 or normalizer.normalize_str(normalized) != normalized:
                continue
            words = [piece for piece, _ in pre_tokenizer.pre_tokenize_str(f"a{normalized}b")]
            if words == [f"a{normalized}b"]:
                word_chars.add(normalized)
            elif words == ["a", normalized, "b"]:
                punctuation.add(normalized)
            else:
                continue
        known.append(char)
        if normalized != char:
            table[char] = normalized

    def normalized_of(match: re.Match[str]) -> str:
        return table[match.group()]

    word_class, punctuation_class = _char_class(word_chars), _char_class(punctuation)
    return LearnedCharacters(
        re.compile(f"[{_char_class(table)}]"),
        normalized_of,
        re.compile(f"[A-Za-z0-9{word_class}]+|[{_ASCII_PUNCTUATION}{punctuation_class}]"),
        re.compile(f"[^\\x00-\\x7f{_char_class(known)}]"),
    )


def _char_class(chars: Iterable[str]) -> str:
    return "".join(re.escape(char) for char in sorted(chars))


def _bert_lowercase(config: dict) -> bool | None:
    """Whether the BERT pipeline of a tokenizer's JSON lowercases; None when it is not exactly
    that pipeline: BertNormalizer that cleans text (behind Lowercase steps, as a model's
    do_lower_case adds one), BertPreTokenizer, WordPiece."""
    normalizer = config.get("normalizer") or {}
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    if not steps or steps[-1].get("type") != "BertNormalizer" or not steps[-1].get("clean_text"):
        return None
    if any(step.get("type") != "Lowercase" for step in steps[:-1]):
        return None
    if (config.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        return None
    if (config.get("model") or {}).get("type") != "WordPiece":
        return None
    return bool(steps[-1].get("lowercase")) or len(steps) > 1


def _specials_around(bare: Tokenizer) -> tuple[list[int], list[int]] | None:
    """The ids the post-processor of `bare` (a tokenizer that neither pads nor cuts) puts before and
    after one text's ids; None when a text's own ids are not found whole in its encoding."""
    content = [token.id for token in bare.model.tokenize("a")]
    ids = bare.encode("a").ids
    at = next((i for i in range(len(ids) - len(content) + 1) if ids[i : i + len(content)] == content), None)
    return None if at is None else (ids[:at], ids[at + len(content) :])
