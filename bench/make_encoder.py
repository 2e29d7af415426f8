"""Random-weight BERT encoders shaped like real embedding models, for speed benchmarks.

    python bench/make_encoder.py OUT_DIR [--shapes minilm,bge-base,bge-large]

Writes OUT_DIR/<shape>/ in sentence-transformers' folder layout (config.json, model.safetensors,
the bundled all-MiniLM-L6-v2 tokenizer files, modules.json, 1_Pooling/config.json, 2_Normalize/,
sentence_bert_config.json, config_sentence_transformers.json). Inference speed depends on the
shape (layers, width, heads, intermediate size, sequence length), not on the weights' values,
so these stand in for the real models where they cannot be downloaded; their vectors mean
nothing. Weights come from torch.manual_seed(--seed), fp32, as the real checkpoints ship.
A shape whose folder is already complete is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from windve.model import bundled_model_path, load_model_spec  # noqa: E402


@dataclass(frozen=True)
class Shape:
    like: str  # the real model this one is shaped like
    layers: int
    hidden: int
    heads: int
    intermediate: int
    pooling: str  # "mean" or "cls"
    max_seq_length: int


SHAPES = {
    "minilm": Shape("sentence-transformers/all-MiniLM-L6-v2", 6, 384, 12, 1536, "mean", 256),
    "bge-base": Shape("BAAI/bge-base-en-v1.5", 12, 768, 12, 3072, "cls", 512),
    "bge-large": Shape("BAAI/bge-large-en-v1.5", 24, 1024, 16, 4096, "cls", 512),
    # MiniLM cut to one layer: ~6x faster, so on a CPU host the host path (HTTP, tokenizer,
    # dispatcher) sets the served rate, as it does on a GPU host. Not the default set.
    "minilm-1l": Shape("sentence-transformers/all-MiniLM-L6-v2", 1, 384, 12, 1536, "mean", 256),
}
DEFAULT_SHAPES = ("minilm", "bge-base", "bge-large")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DONE_MARKER = "modules.json"  # written last: its presence means the folder is complete


def bert_config(shape: Shape) -> dict:
    return {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "model_type": "bert",
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": 30522,
    }


def write_weights(folder: Path, config: dict, seed: int) -> int:
    """BertModel's own random initialisation under a fixed seed; returns the parameter count.

    The pooler is kept, as in the real checkpoints: sentence-transformers loads BertModel with it
    (and would warn that it is missing); WindVE's engines load the encoder without it.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig(**config), add_pooling_layer=True).eval()
    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return sum(tensor.numel() for tensor in tensors.values())


def write_tokenizer(folder: Path, shape: Shape) -> None:
    bundled = bundled_model_path()
    for name in TOKENIZER_FILES:
        shutil.copyfile(bundled / name, folder / name)
    # The bundled tokenizer.json pads and truncates to 128; the real bge files do neither.
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["truncation"] = None
    tokenizer["padding"] = None
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = shape.max_seq_length
    tokenizer_config.pop("name_or_path", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


def write_pipeline(folder: Path, shape: Shape) -> None:
    pooling = {
        "word_embedding_dimension": shape.hidden,
        "pooling_mode_cls_token": shape.pooling == "cls",
        "pooling_mode_mean_tokens": shape.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": shape.max_seq_length, "do_lower_case": True}, indent=2)
    )
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2)
    )
    (folder / "README.md").write_text(
        f"Random weights shaped like {shape.like}, written by bench/make_encoder.py for speed benchmarks.\n"
        "The vectors mean nothing.\n"
    )
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / DONE_MARKER).write_text(json.dumps(modules, indent=2))


def make(out_dir: Path, name: str, seed: int) -> Path:
    shape = SHAPES[name]
    folder = out_dir / name
    if (folder / DONE_MARKER).is_file() and (folder / "model.safetensors").is_file():
        print(f"{name}: {folder} already written, skipped")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    config = bert_config(shape)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    params = write_weights(folder, config, seed)
    write_tokenizer(folder, shape)
    write_pipeline(folder, shape)
    print(f"{name}: {params / 1e6:.1f} M parameters, shaped like {shape.like}, written to {folder}")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = [name.strip() for name in args.shapes.split(",") if name.strip()]
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    for name in names:
        folder = make(args.out_dir, name, args.seed)
        spec = load_model_spec(str(folder))  # the service must accept it as it would the real model
        print(f"  load_model_spec: pooling {spec.pooling}, dim {spec.dim}, max_seq_length {spec.max_seq_length}, "
              f"normalize {spec.normalize}")


if __name__ == "__main__":
    main()
