"""BERT WordPiece token ids, the same as the model's tokenizer gives, at a quarter to a sixth of its cost.

tokenizers spends ~100 us on one 75-token query on a 2-core EPYC host (bench/SERVED.md), more than
a third of a front end's time per request where the front ends set the rate; 40 % of it goes to the
normalizer, which keeps an alignment of every byte for offsets that embedding never reads. On ASCII
text the BERT normalizer and pre-tokenizer come down to three rules: drop control characters (tab,
newline and carriage return are whitespace), lowercase when the model does, and split at whitespace
and around every punctuation character. This module applies them with one regular expression and
takes each word's ids from the tokenizer's own WordPiece model, remembered per word (queries repeat
their words): ~18 us for the same query, the ids equal.

Past ASCII, the characters of text copied from the web or a PDF (accented Latin letters, combining
accents, curly quotes, dashes, no-break and thin spaces, currency signs) and of the scripts BERT
WordPiece models are made for besides English (Greek, Cyrillic, Hebrew, Arabic, Hindi, Vietnamese,
Thai, Chinese and Japanese, whose ideographs the normalizer puts spaces around; Korean, whose
syllables it makes two or three jamo each where it strips accents; fullwidth punctuation):
`CANDIDATES`, are learned at load from the tokenizer's own normalizer and pre-tokenizer
(`_learn`): what each becomes, and whether it is part of a word or stands alone. A text holding
them is mapped by that table and split the same way: ~27 us for the same query with a few of them, against ~100 through
tokenizers.

It serves a tokenizer only when its pipeline is exactly that one (normalizer, pre-tokenizer, model,
a post-processor that puts fixed tokens around one text) and it agrees with the tokenizer on probe
texts at load. A text holding a character it did not learn (Bengali, Tamil, emoji, ...), or an added
token's content in any case, before or after normalizing (`[MASK]` in a query is one token to the
tokenizer), or that is longer than `MAX_CHARS`, is left to the tokenizer.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer
from tokenizers.normalizers import Normalizer
from tokenizers.pre_tokenizers import PreTokenizer

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
# Latin letters, combining accents, typographic punctuation and spaces, currency signs, and the
# scripts named below. Documents and queries copied from the web or from PDFs hold them (curly
# quotes, dashes, no-break spaces, accented names), and one of them sent the whole text to the
# tokenizer.
CANDIDATES = (
    *range(0x80, 0x250),  # Latin-1 Supplement, Latin Extended-A and -B
    *range(0x300, 0x370),  # combining diacritical marks
    *range(0x370, 0x530),  # Greek, Cyrillic and its supplement
    *range(0x590, 0x700),  # Hebrew, Arabic
    *range(0x900, 0x980),  # Devanagari
    *range(0xE00, 0xE80),  # Thai
    *range(0x1100, 0x1200),  # Hangul jamo
    *range(0x1E00, 0x1F00),  # Latin Extended Additional (Vietnamese)
    *range(0x2000, 0x2070),  # general punctuation: spaces, dashes, quotes, bullets, ellipsis
    *range(0x20A0, 0x20D0),  # currency signs
    *range(0x3000, 0x3100),  # CJK symbols and punctuation, hiragana, katakana
    *range(0x3130, 0x3190),  # Hangul compatibility jamo
    *range(0x4E00, 0xA000),  # CJK unified ideographs (what bge-*-zh and Chinese BERTs read)
    *range(0xAC00, 0xD7A4),  # Hangul syllables (NFD, where the normalizer strips accents, makes each two or three jamo)
    *range(0xF900, 0xFB00),  # CJK compatibility ideographs
    *range(0xFF00, 0xFFF0),  # halfwidth and fullwidth forms (Chinese commas, full stops, brackets)
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
    "\u68c0\u7d22\u589e\u5f3a\u751f\u6210\uff08RAG\uff09\u628a\u95ee\u9898\u5d4c\u5165\u4e3a\u5411\u91cf\u3002"
    "\u6771\u4eac\u30bf\u30ef\u30fc\u3001\uf900 \u041f\u0440\u0438\u0432\u0435\u0442\u0401 \u039f\u0394\u039f\u03a3 "
    "Vi\u1ec7t \uff21\uff22\uff23\uff11\uff12\uff13\uff0c",
    "\uac80\uc0c9 \uc99d\uac15 \uc0dd\uc131(RAG)\uc740 \uc9c8\ubb38\uc744 \ubca1\ud130\ub85c. "
    "\u3131\u314f \u1100\u1161 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e04\u0e49\u0e19\u0e2b\u0e32 "
    "\u0645\u0631\u062d\u0628\u0627\u060c "
    "\u0627\u0644\u0652\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629\u061f "
    "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd \u0928\u092e\u0938\u094d\u0924\u0947\u0964 \u0958\u0929",
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
    """Ask `tokenizer`'s own normalizer and pre-tokenizer about each candidate character: both work
    a character at a time (BERT's normalizer maps each, its accent stripping drops every combining
    mark it makes, and its pre-tokenizer splits at whitespace and around punctuation), so a text's
    result is its characters' put together. A character is taken when the normalizer makes it
    ASCII, nothing, one character past ASCII that it leaves as it is, alone or with spaces around
    it (a CJK ideograph, when the normalizer handles Chinese characters), or several without spaces
    (a Hangul syllable's jamo, under NFD) that it leaves as they are, and when the pre-tokenizer
    keeps each such character in a word or puts it alone; the probes at load and a property test
    hold the whole to the tokenizer. `tokenizer` is one `_bert_lowercase` took, so it has both stages."""
    normalizer, pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    chars = [chr(code) for code in CANDIDATES]
    becomes: dict[str, str] = {}  # past ASCII: the one character each becomes
    several: dict[str, str] = {}  # and the characters that become several past ASCII (a syllable's jamo)
    padded: set[str] = set()  # of those, the ones it comes with spaces around
    bare: set[str] = set()  # and those it comes without
    table: dict[str, str] = {}
    known: list[str] = []
    apart: list[str] = []  # ideographs the normalizer sets apart unchanged, each a word: most of them
    for some, pieces in zip(_blocks(chars), _blocks(_normalized_each(normalizer, chars))):
        if pieces == [f" {char} " for char in some] and _whole_between_spaces(pre_tokenizer, some) == set(some):
            apart += some
            continue
        for char, normalized in zip(some, pieces):
            _learn_one(char, normalized, becomes, several, padded, bare, table, known)
    # What a character past ASCII becomes must stay as it is (with its spaces): known for a
    # character that became itself, asked for the others; so must each of the several characters
    # one becomes (they come without spaces: bare). And the pre-tokenizer must keep each in a word
    # or put it alone.
    parts = {part for part in "".join(several.values()) if not part.isascii()}
    bare |= parts
    results = set(becomes.values()) | parts
    same = {char for char, result in becomes.items() if result == char}
    others = sorted(results - same)
    unstable = padded & bare  # set apart where one character becomes it, not where another does
    unstable.update(
        result
        for result, normalized in zip(others, _normalized_each(normalizer, others))
        if normalized != (f" {result} " if result in padded else result)
    )
    kept = sorted(results - unstable)
    alone = _whole_between_spaces(pre_tokenizer, [result for result in kept if result in padded])
    plain = [result for result in kept if result not in padded]
    word_chars = set()
    for result, words in zip(plain, _words_each(pre_tokenizer, [f"a{result}b" for result in plain])):
        if words == [f"a{result}b"]:
            word_chars.add(result)
        elif words == ["a", result, "b"]:
            alone.add(result)
    left = results - word_chars - alone  # a character that becomes any of these is not taken
    for char, result in itertools.chain(becomes.items(), several.items()):
        if left.isdisjoint(result):
            known.append(char)
        else:
            table.pop(char, None)
    known += apart
    alone.update(apart)

    def normalized_of(match: re.Match[str]) -> str:
        return table[match.group()]

    return LearnedCharacters(
        re.compile(f"[{_char_class(table)}]"),
        normalized_of,
        re.compile(f"[A-Za-z0-9{_char_class(word_chars)}]+|[{_ASCII_PUNCTUATION}{_char_class(alone)}]"),
        re.compile(f"[^\\x00-\\x7f{_char_class(known)}]"),
    )


# Characters asked about in one call: a call has a fixed cost of its own, and tokenizers slows on
# long strings (the candidates in one string took ten times as long to pre-tokenize as in strings
# of 512, on a loaded host).
_ASKED_AT_ONCE = 512


def _learn_one(
    char: str,
    normalized: str,
    becomes: dict[str, str],
    several: dict[str, str],
    padded: set[str],
    bare: set[str],
    table: dict[str, str],
    known: list[str],
) -> None:
    """Note what the normalizer made of `char` (see `_learn`); a result past ASCII goes into
    `padded` when it comes with spaces around it, into `bare` when it comes without, and a result
    of several characters without spaces into `several`."""
    if not normalized.isascii():
        spaced = len(normalized) == 3 and normalized[0] == normalized[2] == " "
        if spaced:
            normalized = normalized[1]
        elif len(normalized) > 1 and " " not in normalized:
            several[char] = table[char] = normalized
            return
        if len(normalized) != 1:
            return
        becomes[char] = normalized
        (padded if spaced else bare).add(normalized)
    else:
        known.append(char)
    if normalized != char:
        table[char] = normalized


def _blocks(items: list[str]) -> Iterator[list[str]]:
    """`items` in blocks of `_ASKED_AT_ONCE`, in order."""
    for at in range(0, len(items), _ASKED_AT_ONCE):
        yield items[at : at + _ASKED_AT_ONCE]


def _normalized_each(normalizer: Normalizer, chars: list[str]) -> list[str]:
    """What the normalizer makes of each of `chars`, asked about many at once, joined by "0": it
    leaves "0" as it is, and none of them became one when the pieces come back one per character."""
    results: list[str] = []
    for some in _blocks(chars):
        pieces = normalizer.normalize_str("0".join(some)).split("0")
        results += pieces if len(pieces) == len(some) else [normalizer.normalize_str(char) for char in some]
    return results


def _whole_between_spaces(pre_tokenizer: PreTokenizer, chars: list[str]) -> set[str]:
    """Those of `chars` that the pre-tokenizer makes a word of their own when spaces stand around
    them (as the normalizer puts them around a CJK ideograph), asked about many at once."""
    whole: set[str] = set()
    for some in _blocks(chars):
        if [word for word, _ in pre_tokenizer.pre_tokenize_str(" ".join(some))] == some:
            whole.update(some)
        else:
            whole.update(char for char, words in zip(some, _words_each(pre_tokenizer, some)) if words == [char])
    return whole


def _words_each(pre_tokenizer: PreTokenizer, texts: list[str]) -> list[list[str]]:
    """The pre-tokenizer's words of each of `texts`, asked about many at once, joined by spaces;
    each word goes to the text it starts in (one running over a space would match no text's shape)."""
    words: list[list[str]] = []
    for some in _blocks(texts):
        ends = list(itertools.accumulate(len(text) + 1 for text in some))
        found: list[list[str]] = [[] for _ in some]
        i = 0
        for word, (start, _) in pre_tokenizer.pre_tokenize_str(" ".join(some)):
            while start >= ends[i]:
                i += 1
            found[i].append(word)
        words += found
    return words


def _char_class(chars: Iterable[str]) -> str:
    """A regular expression's class of `chars`, runs of consecutive code points as ranges (the CJK
    ideographs are tens of thousands)."""
    codes = np.fromiter(sorted(set(map(ord, chars))), dtype=np.int64)
    if not codes.size:
        return ""
    starts = [0, *(np.flatnonzero(np.diff(codes) != 1) + 1).tolist()]
    runs = []
    for start, end in zip(starts, [*starts[1:], len(codes)]):
        first, last = re.escape(chr(codes[start])), re.escape(chr(codes[end - 1]))
        runs.append(first if start == end - 1 else f"{first}-{last}")
    return "".join(runs)


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
