"""What tokenizing one query costs a front end, by script: the BERT WordPiece fast path against the
model's tokenizer (tokenizers), on the same texts, in one run.

For each text set (English ASCII; English with typographic quotes, dashes and accents; Chinese;
Russian; Greek; Korean; Arabic), one text a call as a front end tokenizes a query, best of
`--rounds` passes over the set: microseconds a text each way, the share of texts the path took
(the rest go to tokenizers), and whether the ids are equal. Also the time
`BertWordPiece.for_tokenizer` takes once per process (learning the characters past ASCII from
the tokenizer).

    python bench/tokenizing.py [--model DIR] [--cased] [--tokens 75] [--texts 256] [--rounds 3]

`--cased` runs the model's tokenizer as a cased model's (its normalizer neither lowercases nor
strips accents, as multilingual-cased BERTs, LaBSE and Korean BERTs keep Hangul syllables whole).

The model defaults to the bundled all-MiniLM-L6-v2 (bert-base-uncased's vocabulary, which holds
several thousand CJK ideographs, Cyrillic and Greek letters); a bge-*-zh model's vocabulary
would turn more of the Chinese ideographs into ids of their own instead of [UNK], which costs
the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tokenizers import Tokenizer  # noqa: E402

from bench.served import distinct_texts  # noqa: E402
from windve.bert_wordpiece import BertWordPiece  # noqa: E402
from windve.model import load_model_spec  # noqa: E402
from windve.tokenizer import FILLER_TEXT, TextTokenizer, load_fast_tokenizer  # noqa: E402

# Filler passages past ASCII, each about retrieval, cut into queries at word (or, for Chinese,
# character) boundaries by served.py's distinct_texts, as it cuts FILLER_TEXT.
CHINESE = (
    "检索增强生成系统先把用户的问题和知识库中的段落编码为向量，再按向量的相似度找出最相关的段落，"
    "最后把这些段落连同问题一起交给大语言模型生成回答。嵌入服务的延迟直接决定了整个问答流程的响应时间，"
    "因此在图形处理器和神经网络处理器上高效地批量计算向量，并在负载过高时及时拒绝多余的请求，"
    "是保证服务质量的关键。向量数据库通常按余弦相似度或内积检索，索引可以是分层可导航小世界图，"
    "也可以是倒排文件加乘积量化。"
)
RUSSIAN = (
    "Система генерации с дополненной выборкой сначала кодирует вопрос пользователя и фрагменты базы "
    "знаний в векторы, затем находит самые похожие фрагменты по косинусной мере и передаёт их вместе "
    "с вопросом большой языковой модели. Задержка сервиса эмбеддингов определяет время ответа всей "
    "цепочки, поэтому важно эффективно вычислять векторы пакетами на графических процессорах и "
    "быстро отказывать лишним запросам при перегрузке."
)
GREEK = (
    "Ένα σύστημα παραγωγής με ενισχυμένη ανάκτηση κωδικοποιεί πρώτα την ερώτηση του χρήστη και τα "
    "αποσπάσματα της βάσης γνώσης σε διανύσματα, βρίσκει τα πιο όμοια αποσπάσματα και τα δίνει μαζί "
    "με την ερώτηση σε ένα μεγάλο γλωσσικό μοντέλο. Η καθυστέρηση της υπηρεσίας ΕΝΣΩΜΑΤΩΣΗΣ ορίζει "
    "τον χρόνο απόκρισης όλης της αλυσίδας."
)
KOREAN = (
    "검색 증강 생성 시스템은 먼저 사용자의 질문과 지식 베이스의 문단을 벡터로 인코딩한 다음, 가장 "
    "유사한 문단을 찾아 질문과 함께 대규모 언어 모델에 전달합니다. 임베딩 서비스의 지연 시간은 전체 "
    "파이프라인의 응답 시간을 결정합니다."
)
ARABIC = (
    "يقوم نظام التوليد المعزز بالاسترجاع أولا بترميز سؤال المستخدم وفقرات قاعدة المعرفة إلى متجهات، ثم "
    "يبحث عن الفقرات الأكثر تشابها ويمررها مع السؤال إلى نموذج لغوي كبير. يحدد زمن استجابة خدمة "
    "التضمين زمن استجابة السلسلة كلها، لذلك يجب حساب المتجهات بكفاءة ورفض الطلبات الزائدة بسرعة."
)


def typographic(text: str) -> str:
    """English as copied from the web or a PDF: curly apostrophes, em dashes, an accent or two."""
    curly = text.replace("'", "\u2019").replace(" - ", " \u2014 ").replace("e ", "\u00e9 ", 1)
    return curly + " \u201cr\u00e9sum\u00e9\u201d"


def per_text_us(encode, texts: list[str], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for text in texts:
            encode(text)
        best = min(best, time.perf_counter() - started)
    return best / len(texts) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a model folder (default: the bundled model)")
    parser.add_argument("--cased", action="store_true", help="the tokenizer as a cased model's")
    parser.add_argument("--tokens", type=int, default=75)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = load_model_spec(str(args.model) if args.model else None)
    tokenizer = load_fast_tokenizer(spec.path, spec.lower_case)
    if args.cased:
        config = json.loads(tokenizer.to_str())
        config["normalizer"]["lowercase"] = False  # strip_accents unset: it follows lowercase
        tokenizer = Tokenizer.from_str(json.dumps(config))
    limit = spec.max_seq_length

    loads = []
    for _ in range(3):
        started = time.perf_counter()
        fast = BertWordPiece.for_tokenizer(tokenizer, limit)
        loads.append(time.perf_counter() - started)
    if fast is None:
        sys.exit(f"{spec.name}'s tokenizer has no BERT WordPiece fast path")
    print(f"model {spec.name}; for_tokenizer (once a process) {min(loads) * 1e3:.1f} ms, best of 3")

    reference = Tokenizer.from_str(tokenizer.to_str())
    reference.no_padding()
    reference.enable_truncation(limit)
    sets = {
        "english": (FILLER_TEXT.split(), " "),
        "typographic": (typographic(FILLER_TEXT).split(), " "),
        "chinese": (list(CHINESE), ""),
        "russian": (RUSSIAN.split(), " "),
        "greek": (GREEK.split(), " "),
        "korean": (KOREAN.split(), " "),
        "arabic": (ARABIC.split(), " "),
    }
    print(f"{'texts':>12} {'tokens':>7} {'fast path':>10} {'tokenizers':>11} {'ratio':>6} {'taken':>6} {'equal':>6}")
    counter = TextTokenizer(spec, max_tokens=limit)
    for name, (units, joiner) in sets.items():
        texts = distinct_texts(counter, args.texts, args.tokens, units=units, joiner=joiner, exact=False)
        taken = [fast.encode(text, "right") for text in texts]
        expected = reference.encode_batch(texts)
        equal = all(got is None or got.ids == want.ids for got, want in zip(taken, expected))
        mean_tokens = sum(len(want.ids) for want in expected) / len(expected)
        fast_us = per_text_us(lambda text: fast.encode(text, "right") or reference.encode(text), texts, args.rounds)
        slow_us = per_text_us(reference.encode, texts, args.rounds)
        share = sum(got is not None for got in taken) / len(taken)
        print(
            f"{name:>12} {mean_tokens:7.1f} {fast_us:8.1f}us {slow_us:9.1f}us {slow_us / fast_us:6.2f} "
            f"{share:6.0%} {str(equal):>6}"
        )


if __name__ == "__main__":
    main()
