"""What a GPU batch costs beyond its arithmetic: first calls at new shapes, and launch overhead.

    python bench/launch.py --model DIR [--batches 1,8,32,128,218] [--tokens 75] [--dtype fp16]
                           [--sdpa default|no-cudnn] [--blas default|cublas]

Two tables, on cuda:0 (the script exits on a machine without CUDA):
- new shapes: for each batch size, the first forward at that shape (cuBLAS and attention kernels
  chosen for it) and the median of the next ones. The queue manager forms batches of any size,
  so every size it has not met yet pays the first-call cost while clients wait;
- launch overhead: for each batch size, the eager forward against a CUDA graph of the same
  forward replayed (torch.cuda.CUDAGraph over static input buffers), and the largest relative
  difference of their outputs. A graph replays every kernel launch of the forward as one.

bench/SERVED.md records what it printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from windve.engines.torch_engine import load_encoder
from windve.model import load_model_spec


def timed(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def inputs(batch: int, tokens: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(1000, vocab, size=(batch, tokens))).to("cuda")
    return ids, torch.ones_like(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batches", default="1,8,32,128,218")
    parser.add_argument("--new-shapes", default="1,3,7,12,20,33,50,77,100,150,218")
    parser.add_argument("--tokens", type=int, default=75)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sdpa", choices=("default", "no-cudnn"), default="default",
                        help="no-cudnn: attention without cuDNN's kernels (its graphs are built per shape)")
    parser.add_argument("--blas", choices=("default", "cublas"), default="default",
                        help="cublas: matrix products through cuBLAS rather than cuBLASLt")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/launch.py needs CUDA")
    if args.sdpa == "no-cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.blas == "cublas":
        torch.backends.cuda.preferred_blas_library("cublas")
    spec = load_model_spec(args.model)
    model = load_encoder(spec, args.dtype).to("cuda")
    vocab = model.config.vocab_size

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    with torch.inference_mode():
        forward(*inputs(4, args.tokens, vocab, 0))  # context, cuBLAS handle, allocator
        torch.cuda.synchronize()
        where = f"cuda:0 ({torch.cuda.get_device_name(0)})"
        print(f"\n== new shapes: {spec.name}, {args.dtype}, {args.tokens} tokens, {where}, "
              f"sdpa {args.sdpa}, blas {args.blas}")
        print(f"{'batch':>6} {'first ms':>9} {'then ms':>8} {'extra ms':>9}")
        for batch in [int(b) for b in args.new_shapes.split(",")]:
            ids, mask = inputs(batch, args.tokens, vocab, batch)
            first = timed(lambda: forward(ids, mask), 1)
            then = timed(lambda: forward(ids, mask), 5)
            print(f"{batch:>6} {first * 1e3:>9.2f} {then * 1e3:>8.2f} {(first - then) * 1e3:>9.2f}", flush=True)

    print(f"\n== launch overhead: eager vs one CUDA graph replay, {args.repeats} timed runs each")
    print(f"{'batch':>6} {'eager ms':>9} {'graph ms':>9} {'eager q/s':>10} {'graph q/s':>10} {'max rel diff':>13}")
    for batch in [int(b) for b in args.batches.split(",") if b]:
        ids, mask = inputs(batch, args.tokens, vocab, 7 * batch)
        with torch.inference_mode():
            eager = timed(lambda: forward(ids, mask), args.repeats)
            want = forward(ids, mask).float()
        try:
            static_ids, static_mask = ids.clone(), mask.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs asks
                    forward(static_ids, static_mask)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.inference_mode():
                out = forward(static_ids, static_mask)
            graphed = timed(graph.replay, args.repeats)
            graph.replay()
            torch.cuda.synchronize()
            diff = float((out.float() - want).norm() / want.norm())
            print(f"{batch:>6} {eager * 1e3:>9.2f} {graphed * 1e3:>9.2f} {batch / eager:>10.0f} "
                  f"{batch / graphed:>10.0f} {diff:>13.2e}", flush=True)
        except Exception as error:  # noqa: BLE001 - a forward that cannot be captured is a result too
            print(f"{batch:>6} {eager * 1e3:>9.2f}  capture failed: {type(error).__name__}: {str(error)[:200]}")
            torch.cuda.synchronize()


if __name__ == "__main__":
    main()
