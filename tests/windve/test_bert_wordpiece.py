"""The WordPiece fast path gives the model's tokenizer's ids, exactly, or leaves the text to it."""

from __future__ import annotations

import json
import re
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer

from windve.bert_wordpiece import CANDIDATES, LONGEST_REMEMBERED, MAX_CHARS, BertWordPiece, _char_class
from windve.model import ModelSpec
from windve.tokenizer import InputTooLong, TextTokenizer, load_fast_tokenizer

LIMIT = 24  # small, so that generated texts are often cut


def reference(tokenizer: Tokenizer, side: str, limit: int = LIMIT) -> Tokenizer:
    """The model's tokenizer as the service configures it: no padding, cut at `limit` at `side`."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.enable_truncation(limit, direction=side)
    return copy


def variant(tokenizer: Tokenizer, change) -> Tokenizer:
    config = json.loads(tokenizer.to_str())
    change(config)
    return Tokenizer.from_str(json.dumps(config))


@pytest.fixture(scope="module")
def bundled(model_spec: ModelSpec) -> Tokenizer:
    return load_fast_tokenizer(model_spec.path, model_spec.lower_case)


@pytest.fixture(scope="module")
def cased(bundled: Tokenizer) -> Tokenizer:
    """The bundled tokenizer as a cased model's: its normalizer keeps the case."""
    return variant(bundled, lambda config: config["normalizer"].update(lowercase=False))


# Letters of both cases, digits, every punctuation character, the whitespace and the control
# characters the normalizer treats apart, and whole words from the vocabulary.
_CHARACTERS = st.sampled_from(
    list(string.ascii_letters + string.digits + string.punctuation + " \t\n\r\x0b\x0c\x00\x01\x1f\x7f")
)
_WORDS = st.sampled_from(["embedding", "Retrieval", "unaffable", "GPU", "don't", "snake_case", "3.14", "a" * 120])
_TEXTS = st.lists(st.one_of(_CHARACTERS, _WORDS, st.just(" ")), min_size=1, max_size=60).map("".join)
# Past ASCII: every character the path may learn (accented letters of both cases, combining accents,
# typographic spaces, dashes and quotes, currency, Greek, Cyrillic, Hebrew, Arabic, Devanagari,
# Vietnamese, Thai, CJK ideographs, kana, Hangul syllables and jamo, fullwidth forms), words made of
# them, and characters it leaves to the tokenizer (an emoji, the trademark sign, Bengali, rare
# ideographs: of extension A and past the basic plane).
_LEFT_OUT = "🙂™\u0995\u3400\U00020000"
_WIDE_CHARACTERS = st.sampled_from([chr(code) for code in CANDIDATES] + list(_LEFT_OUT))
_WIDE_WORDS = st.sampled_from(
    ["café", "NAÏVE", "Ærøskøbing", "e\u0301", "it’s", "“quoted”", "—", "5\u00a0€", "检索增强生成。", "東京タワー",
     "ガ\u3099", "Ёлка", "ΟΔΟΣ", "Việt", "ＡＢＣ１２３，", "\uf900", "검색 증강 생성", "한국어", "ㄱㄴㄷ", "ᄀ\u1161",
     "ภาษาไทย", "ค้นหา", "مرحبا، بالعالم؟", "الْعَرَبِيَّة", "שָׁלוֹם", "नमस्ते दुनिया।", "क़"]
)
_WIDE_TEXTS = st.lists(
    st.one_of(_CHARACTERS, _WORDS, _WIDE_CHARACTERS, _WIDE_WORDS, st.just(" ")), min_size=1, max_size=60
).map("".join)


@pytest.fixture(scope="module")
def both_ways(bundled: Tokenizer, cased: Tokenizer) -> list[tuple[BertWordPiece, str, Tokenizer]]:
    """(fast path, side, the tokenizer cutting at that side) for the uncased and the cased pipeline."""
    made = []
    for tokenizer in (bundled, cased):
        fast = BertWordPiece.for_tokenizer(tokenizer, LIMIT)
        assert fast is not None
        made += [(fast, side, reference(tokenizer, side)) for side in ("right", "left")]
    return made


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_TEXTS)
def test_ascii_ids_are_the_tokenizers(both_ways: list[tuple[BertWordPiece, str, Tokenizer]], text: str) -> None:
    for fast, side, tokenizer in both_ways:
        expected = tokenizer.encode(text)
        got = fast.encode(text, side)
        assert got is not None and got.ids == expected.ids, (text, side)
        assert got.overflowed == bool(expected.overflowing)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_WIDE_TEXTS)
def test_ids_past_ascii_are_the_tokenizers(both_ways: list[tuple[BertWordPiece, str, Tokenizer]], text: str) -> None:
    """Texts past ASCII: the path takes every one without a character it left out, and its ids are
    the tokenizer's (uncased: accents stripped; cased: kept)."""
    left_out = any(char in _LEFT_OUT for char in text)
    for fast, side, tokenizer in both_ways:
        expected = tokenizer.encode(text)
        got = fast.encode(text, side)
        assert (got is None) == left_out, (text, side)
        if got is not None:
            assert got.ids == expected.ids, (text, side)
            assert got.overflowed == bool(expected.overflowing)


def test_every_candidate_character_alone_and_among_letters(
    both_ways: list[tuple[BertWordPiece, str, Tokenizer]],
) -> None:
    """Each of the characters the path may learn, in every place a text may put it: alone, inside a
    word of both cases, between words, next to punctuation, doubled."""
    for fast, side, tokenizer in both_ways[::2]:  # one side each: the cut is checked above
        for code in CANDIDATES:
            char = chr(code)
            texts = [char, f"Ab{char}Cd", f"x {char} Y", f"{char}{char}.", f"({char}e", f"É{char}"]
            for text, expected in zip(texts, tokenizer.encode_batch(texts)):
                got = fast.encode(text, side)
                assert got is not None and got.ids == expected.ids, (hex(code), text)


def test_texts_the_path_leaves_to_the_tokenizer(bundled: Tokenizer) -> None:
    fast = BertWordPiece.for_tokenizer(bundled, 256)
    assert fast is not None
    # A character it did not learn (Bengali, an emoji); an added token's content, in any case,
    # which the tokenizer reads as that one token; a text past MAX_CHARS.
    left = ("বাংলা tower", "café \u3400", "🙂 ok", "fill the [MASK] in", "the [cls] token", "a " * (MAX_CHARS // 2 + 1))
    for text in left:
        assert fast.encode(text, "right") is None, text
    for text in ("fill the MASK in", "café au lait", "it’s “quoted” — ok", "no-break\u00a0space", "東京 tower", "Ω",
                 "서울 tower", "café ก", "سلام tower"):
        assert fast.encode(text, "right") is not None, text


def test_an_added_token_that_matches_once_normalized_goes_to_the_tokenizer(bundled: Tokenizer) -> None:
    """A token added with `normalized=True` is matched on the text after its control characters
    are dropped and its case lowered: "WIND\x01VE" is that one token to the tokenizer."""
    tokenizer = Tokenizer.from_str(bundled.to_str())
    tokenizer.add_tokens([AddedToken("windve", normalized=True)])
    fast = BertWordPiece.for_tokenizer(tokenizer, 256)
    assert fast is not None
    assert fast.encode("WIND\x01VE", "right") is None
    assert fast.encode("WIND VE", "right") is not None


def test_other_pipelines_get_no_fast_path(bundled: Tokenizer) -> None:
    def nfc_first(config: dict) -> None:
        config["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, config["normalizer"]]}

    others = [
        variant(bundled, nfc_first),
        variant(bundled, lambda config: config.update(pre_tokenizer={"type": "Whitespace"})),
        variant(bundled, lambda config: config["normalizer"].update(clean_text=False)),
    ]
    for tokenizer in others:
        assert BertWordPiece.for_tokenizer(tokenizer, 256) is None
    assert BertWordPiece.for_tokenizer(bundled, 2) is None  # no room between [CLS] and [SEP]


def test_text_tokenizer_mixes_both_paths_in_order(model_spec: ModelSpec, bundled: Tokenizer) -> None:
    tokenizer = TextTokenizer(model_spec, max_tokens=LIMIT)
    assert tokenizer._fast is not None
    long_ascii, long_other = "word " * 40, "mot à mot " * 30
    texts = ["A query, in ASCII.", "Une requête", "fill the [MASK]", "東京", "서울", "বাংলা", long_ascii, long_other]
    for side in ("right", "left"):
        expected = reference(bundled, side).encode_batch(texts)
        got = tokenizer.encode(texts, truncate=True, side=side)
        assert [list(ids) for ids in got] == [encoding.ids for encoding in expected]
        assert all(ids.dtype == np.int32 for ids in got)
    # Without truncation the first over-long text is named, whichever path it took.
    for texts, first in (([long_other, long_ascii], 0), (["short", long_ascii, long_other], 1)):
        with pytest.raises(InputTooLong) as raised:
            tokenizer.encode(texts, truncate=False)
        assert raised.value.index == first


def test_only_short_words_are_remembered(bundled: Tokenizer) -> None:
    fast = BertWordPiece.for_tokenizer(bundled, 256)
    assert fast is not None
    before = fast._remembered.cache_info().currsize
    got = fast.encode("x" * (LONGEST_REMEMBERED + 1) + " " + "y" * LONGEST_REMEMBERED, "right")
    assert got is not None and got.ids == reference(bundled, "right", 256).encode("x" * 65 + " " + "y" * 64).ids
    assert fast._remembered.cache_info().currsize == before + 1  # the 64-letter word only


def test_ideographs_stay_in_words_where_the_normalizer_does_not_set_them_apart(bundled: Tokenizer) -> None:
    """Without `handle_chinese_chars` the normalizer puts no spaces around an ideograph: the
    pre-tokenizer keeps a run of them as one word, and so does the path."""
    apart = reference(bundled, "right", 256)
    together = variant(bundled, lambda config: config["normalizer"].update(handle_chinese_chars=False))
    fast = BertWordPiece.for_tokenizer(together, 256)
    assert fast is not None
    together = reference(together, "right", 256)
    for text in ("東京タワー", "检索增强生成，然后找出。", "a東b 京x"):
        got = fast.encode(text, "right")
        assert got is not None and got.ids == together.encode(text).ids, text
        assert got.ids != apart.encode(text).ids, text  # the two pipelines differ on it


def test_character_classes_are_written_as_ranges_and_match_exactly_their_characters() -> None:
    """The learned classes are written as runs of code points; escaping keeps `-`, `]`, `\\` and
    `^` literal, and an empty set is an empty class body (a pipeline may learn no word character)."""
    assert _char_class([]) == ""
    chars = ["-", "]", "\\", "^", "a", "b", "c", "e", "東", "京", "\u4e00", "\u4e01", "\u4e02"]
    body = _char_class(chars)
    assert body.count("-") < len(chars)  # runs came out as ranges
    pattern = re.compile(f"[{body}]")
    for code in [*range(0x20, 0x80), *range(0x4DF0, 0x4E10), ord("東"), ord("京"), ord("東") + 1]:
        assert bool(pattern.fullmatch(chr(code))) == (chr(code) in chars), hex(code)
