"""Completion log-probs, forward + backward: TRL's fused LM head (what GRPOTrainer, and so every trainer here, uses)
against full logits over the completion positions (what TRL's experimental A2POTrainer uses), same model and batch.

    python benchmarks/bench_fused_head.py                     # the 32k-vocabulary model of bench_trainers.py
    python benchmarks/bench_fused_head.py --model tiny        # the shipped 100-token-vocabulary model

Each (repetition, method) runs in a fresh child process (peak memory = its max RSS on CPU, or
``torch.cuda.max_memory_allocated`` on GPU), interleaved. Writes ``results/benchmarks/bench_fused_head.{json,md}``.

Why it exists: on CPU, APOTrainer is slower and heavier than A2POTrainer with a large vocabulary
(docs/RESULTS.md). This isolates the one computation the two do differently. Without Triton, TRL 1.16 folds the
fused head in plain torch over tiles of 4096 tokens x 32768 vocabulary entries, scoring every position (prompt and
padding too); with Triton (CUDA/XPU) it scores only the completion tokens and never holds a full logits row block.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
METHODS = ("trl_fused_head", "full_logits")


def child(args) -> None:
    import resource

    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head, selective_log_softmax

    torch.set_num_threads(args.threads)
    device = "cuda" if args.gpu else "cpu"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model_path).to(device)
    if args.child == "trl_fused_head":
        add_fused_lm_head(model)
    vocab = model.config.vocab_size
    B, P, C = args.rows, args.prompt_len, args.completion_len
    ids = torch.randint(0, vocab, (B, P + C), device=device)
    attn = torch.ones_like(ids)

    def completion_logps():
        if args.child == "trl_fused_head":  # as GRPOTrainer._get_per_token_logps_and_entropies calls it
            labels = ids.clone()
            labels[:, :-C] = -100
            return model(input_ids=ids, attention_mask=attn, labels=labels, fused_lm_head=True).log_probs[:, -C:]
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=C + 1).logits[:, :-1]  # as A2POTrainer
        return selective_log_softmax(logits, ids[:, -C:])

    if args.gpu:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.warmup + args.steps):
        if args.gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        completion_logps().sum().backward()
        if args.gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if args.gpu
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("RESULT " + json.dumps({"method": args.child, "time_s": statistics.median(times[args.warmup:]),
                                  "peak_mem_mb": peak, "vocab": vocab}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["tiny", "bigvocab"], default="bigvocab")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt_len", type=int, default=40)
    ap.add_argument("--completion_len", type=int, default=56)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "bench_fused_head"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model_path", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    from bench_trainers import interleaved_runs, medium_model

    from trl_variants.default import DEFAULT_MODEL_PATH

    model_path = (str(DEFAULT_MODEL_PATH) if args.model == "tiny"
                  else medium_model(ROOT / "outputs" / "bench-bigvocab", big_vocab=True))
    runs = interleaved_runs(__file__, list(METHODS), model_path, args,
                            ("rows", "prompt_len", "completion_len", "steps", "warmup", "threads"))
    summary = {m: {"time_s": statistics.median(r["time_s"] for r in rs),
                   "peak_mem_mb": statistics.median(r["peak_mem_mb"] for r in rs)} for m, rs in runs.items()}
    base = summary["full_logits"]
    for s in summary.values():
        s["time_ratio"], s["mem_ratio"] = s["time_s"] / base["time_s"], s["peak_mem_mb"] / base["peak_mem_mb"]
    meta = {k: getattr(args, k) for k in ("model", "rows", "prompt_len", "completion_len", "reps", "steps", "gpu")}
    meta["vocab"] = runs["full_logits"][0]["vocab"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"settings": meta, "summary": summary, "runs": runs}, indent=1))
    lines = [f"Settings: {meta}", "", "| method | fwd+bwd (s) | peak mem (MB) | time / full logits | mem / full logits |",
             "|---|---|---|---|---|"]
    lines += [f"| {m} | {s['time_s']:.3f} | {s['peak_mem_mb']:.0f} | {s['time_ratio']:.2f} | {s['mem_ratio']:.2f} |"
              for m, s in summary.items()]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
