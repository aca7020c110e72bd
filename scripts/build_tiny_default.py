"""Rebuild the embedded default model shipped in ``trl_variants/default/assets`` (tokenizer + SFT pre-training).

    python scripts/build_tiny_default.py [--out DIR] [--threads 1]
    python scripts/build_tiny_default.py --init_from trl_variants/default/assets --prompt_loss --lr 1e-3 \
        --warmup 10 --max_steps 400 --eval_every 400 --stop_low 0 --stop_high 1 --out outputs/tiny-prompt-trained
        # a variant of the shipped model that also learned the prompts (benchmarks/replicate.py --base_model)

Deterministic in its seed on a given machine/thread count: a ~1M-parameter Llama model is trained on fresh
synthetic problems (loss on completion tokens only) and evaluated every ``--eval_every`` steps on a validation set
(seed 12345, never the test split). Training stops at the first evaluation where sampled accuracy (T = 1.0) lies in
``[--stop_low, --stop_high]`` and level 1 is near-perfect, so the shipped policy leaves RL room to improve.
About 10 CPU minutes on one thread.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from trl_variants.default import (
    DEFAULT_MODEL_PATH,
    build_tokenizer,
    generate_problems,
    load_default_dataset,
    measure_accuracy,
    problems_to_dataset,
)
from trl_variants.generation import tokenize_prompts


def model_config(tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )


def make_batch(tokenizer, problems, prompt_loss: bool = False):
    """Right-padded prompt+completion ids with labels on the completion (and its EOS) only, or on every token with
    ``prompt_loss``."""
    prompts = tokenize_prompts(tokenizer, [[{"role": "user", "content": p.question}] for p in problems])
    rows = []
    for p_ids, prob in zip(prompts, problems, strict=True):
        c_ids = tokenizer(prob.completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p_ids + c_ids, (p_ids if prompt_loss else [-100] * len(p_ids)) + c_ids))
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, mask, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_MODEL_PATH)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max_steps", type=int, default=2500)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--stop_low", type=float, default=0.30)
    ap.add_argument("--stop_high", type=float, default=0.55)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt_loss", action="store_true", help="also train on the prompt tokens")
    ap.add_argument("--init_from", default=None, help="continue from this model instead of a random init")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_tokenizer()
    model = (LlamaForCausalLM.from_pretrained(args.init_from) if args.init_from
             else LlamaForCausalLM(model_config(tokenizer)))
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step):  # linear warm-up, then cosine to 0.1x
        if step < args.warmup:
            return (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.max_steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    val = problems_to_dataset(generate_problems(200, seed=12345))
    rng_seed = args.seed * 7919 + 1
    log, start, chosen = [], time.time(), None
    for step in range(1, args.max_steps + 1):
        problems = generate_problems(args.batch_size, seed=rng_seed + step)
        ids, mask, labels = make_batch(tokenizer, problems, prompt_loss=args.prompt_loss)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % args.eval_every == 0:
            sampled = measure_accuracy(model, tokenizer, val, do_sample=True, seed=step)
            row = {"step": step, "time_s": round(time.time() - start, 1), "loss": round(loss.item(), 4),
                   "sampled": sampled}
            log.append(row)
            print(json.dumps(row), flush=True)
            if args.stop_low <= sampled["overall"] <= args.stop_high and sampled["level_1"] >= 0.9:
                chosen = step
                break
    if chosen is None:
        raise SystemExit(f"no evaluation reached the stop window in {args.max_steps} steps; see the log above")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0,
        top_p=1.0, top_k=0, max_new_tokens=64,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    test = load_default_dataset(n_train=0)["test"]
    report = {
        "stopped_at_step": chosen,
        "options": {k: v for k, v in vars(args).items() if k != "out"},
        "train_seconds": round(time.time() - start, 1),
        "test_greedy": measure_accuracy(model, tokenizer, test, do_sample=False),
        "test_sampled_T1": measure_accuracy(model, tokenizer, test, do_sample=True, seed=0),
        "curve": log,
    }
    (out / "build_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "curve"}, indent=1))


if __name__ == "__main__":
    main()
