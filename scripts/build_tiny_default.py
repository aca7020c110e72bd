"""Rebuild the embedded default model shipped in ``trl_variants/default/assets`` (tokenizer + SFT pre-training).

    python scripts/build_tiny_default.py                      # the shipped model: stage 1 + stage 2, one thread
    python scripts/build_tiny_default.py --then_steps 0 --out /tmp/stage1      # stage 1 only, then
    python scripts/build_tiny_default.py --init_from /tmp/stage1               # stage 2 from it (how it was built)

A ~1M-parameter Llama model learns the multi-step addition task (``trl_variants.default.task``) on full sequences
(loss on the prompt and the answer; ``--completion_only`` for the answer only), on fresh problems every step, each
answered either step by step or directly (``\\boxed{N}``):

* stage 1 (1500 steps, AdamW lr 3e-3, 100 warm-up steps then cosine to 0.1x): 60% direct answers. The model ends
  up adding the digits well in one pass (direct answers right 80-100% of the time) and executing the steps poorly.
* stage 2 (60 steps, a fresh AdamW at lr 3e-4): 30% direct answers, which tilts the model's choice of style towards
  the steps (about 70% of sampled answers, every greedy one) while keeping its direct skill.

The result is a base on which RL has signal: most prompts are solved sometimes but not always, and learning when
to answer directly raises held-out accuracy, greedy included (README, "The embedded default"). Validation every
``--eval_every`` steps on 200 problems (seed 12345, never the test split); at the end the held-out test accuracy and
the per-prompt pass rates of training prompts (``--pass_rate_k`` samples each) go to ``build_report.json``.
Deterministic in its seed on a given machine and thread count (fixed problem and style seeds per step, no dropout);
about 10 minutes on one idle CPU thread.
"""

from __future__ import annotations

import argparse
import json
import math
import random
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


def make_batch(tokenizer, problems, direct: list[bool], prompt_loss: bool = True):
    """Right-padded prompt+completion ids with labels on every token (full sequences: the prompt too, so ERPO's
    prompt log-likelihoods are meaningful), or on the completion and its EOS only when not ``prompt_loss``.
    ``direct[i]`` picks problem i's direct answer instead of its steps."""
    prompts = tokenize_prompts(tokenizer, [[{"role": "user", "content": p.question}] for p in problems])
    rows = []
    for p_ids, prob, d in zip(prompts, problems, direct, strict=True):
        text = prob.direct if d else prob.completion
        c_ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p_ids + c_ids, (p_ids if prompt_loss else [-100] * len(p_ids)) + c_ids))
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)], labels[i, : len(y)], mask[i, : len(x)] = torch.tensor(x), torch.tensor(y), 1
    return ids, mask, labels


def pass_rates(model, tokenizer, dataset, k: int, seed: int = 0, max_new_tokens: int = 64) -> list[float]:
    """Per-prompt fraction of ``k`` samples (T = 1) that the accuracy reward scores 1."""
    from trl_variants.generation import generate_completions
    from trl_variants.rewards import accuracy_reward

    torch.manual_seed(seed)
    ids = tokenize_prompts(tokenizer, dataset["prompt"])
    comps = generate_completions(model, tokenizer, ids, k, max_new_tokens=max_new_tokens, temperature=1.0,
                                 do_sample=True, batch_size=256)
    rates = []
    for samples, gold in zip(comps, dataset["solution"], strict=True):
        texts = tokenizer.batch_decode(samples, skip_special_tokens=True)
        rates.append(sum(accuracy_reward(texts, [gold] * k)) / k)
    return rates


def evaluate(model, tokenizer, dataset, seed: int) -> dict:
    return {"greedy": measure_accuracy(model, tokenizer, dataset, do_sample=False),
            "sampled_T1": measure_accuracy(model, tokenizer, dataset, do_sample=True, seed=seed)}


def sft(model, tokenizer, args, *, steps: int, lr: float, warmup: int, cosine: bool, direct_fraction: float,
        seed: int, val, log: list) -> None:
    """``steps`` AdamW steps on fresh problems (a fresh optimizer; linear warm-up, then cosine to 0.1x or constant),
    each answer direct with probability ``direct_fraction``; evaluates on ``val`` every ``--eval_every`` steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)) if cosine else 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    style = random.Random(seed * 104729 + 7)
    start = time.time()
    for step in range(1, steps + 1):
        problems = generate_problems(args.batch_size, seed=seed * 7919 + 1 + step)
        direct = [style.random() < direct_fraction for _ in problems]
        ids, mask, labels = make_batch(tokenizer, problems, direct, prompt_loss=not args.completion_only)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % args.eval_every == 0 or step == steps:
            row = {"stage_seed": seed, "step": step, "time_s": round(time.time() - start, 1),
                   "loss": round(loss.item(), 4), **evaluate(model, tokenizer, val, seed=step)}
            log.append(row)
            print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_MODEL_PATH)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--max_steps", type=int, default=1500, help="stage 1: steps")
    ap.add_argument("--lr", type=float, default=3e-3, help="stage 1: peak learning rate (cosine to 0.1x)")
    ap.add_argument("--warmup", type=int, default=100, help="stage 1: warm-up steps")
    ap.add_argument("--direct_fraction", type=float, default=0.6,
                    help="stage 1: share of answers given directly (\\boxed{N}) instead of step by step")
    ap.add_argument("--then_steps", type=int, default=60, help="stage 2: steps (0: no stage 2)")
    ap.add_argument("--then_lr", type=float, default=3e-4, help="stage 2: constant learning rate after 10 warm-up")
    ap.add_argument("--then_direct_fraction", type=float, default=0.3, help="stage 2: share of direct answers")
    ap.add_argument("--eval_every", type=int, default=250)
    ap.add_argument("--pass_rate_prompts", type=int, default=400, help="training prompts in the pass-rate report")
    ap.add_argument("--pass_rate_k", type=int, default=16, help="samples per prompt in the pass-rate report")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--completion_only", action="store_true", help="loss on completion tokens only (not the prompt)")
    ap.add_argument("--init_from", default=None,
                    help="skip stage 1 and start stage 2 from this model (e.g. a stage-1 model saved with "
                         "--then_steps 0: the result is identical to one run, stage 2 starts a fresh optimizer)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_tokenizer()
    val = problems_to_dataset(generate_problems(200, seed=12345))
    log, start = [], time.time()
    if args.init_from:
        model = LlamaForCausalLM.from_pretrained(args.init_from)
    else:
        model = LlamaForCausalLM(model_config(tokenizer))
        print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
        sft(model, tokenizer, args, steps=args.max_steps, lr=args.lr, warmup=args.warmup, cosine=True,
            direct_fraction=args.direct_fraction, seed=args.seed, val=val, log=log)
    if args.then_steps:
        sft(model, tokenizer, args, steps=args.then_steps, lr=args.then_lr, warmup=10, cosine=False,
            direct_fraction=args.then_direct_fraction, seed=args.seed + 1, val=val, log=log)
    train_seconds = round(time.time() - start, 1)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0,
        top_p=1.0, top_k=0, max_new_tokens=64,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    splits = load_default_dataset()
    rates = pass_rates(model, tokenizer, splits["train"].select(range(args.pass_rate_prompts)), args.pass_rate_k)
    report = {
        "options": {k: v for k, v in vars(args).items() if k != "out"},
        "train_seconds": train_seconds,
        "test": {"prompts": len(splits["test"]), **evaluate(model, tokenizer, splits["test"], seed=0)},
        "train_pass_rates": {
            "prompts": len(rates), "k": args.pass_rate_k,
            "frac_strictly_between_0_and_1": sum(0 < r < 1 for r in rates) / len(rates),
            "frac_all_correct": sum(r == 1 for r in rates) / len(rates),
            "frac_all_wrong": sum(r == 0 for r in rates) / len(rates),
            "mean": sum(rates) / len(rates),
        },
        "curve": log,
    }
    if args.init_from and (Path(args.init_from) / "build_report.json").exists():
        report["stage_1_report"] = json.loads((Path(args.init_from) / "build_report.json").read_text())
    (out / "build_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("curve", "stage_1_report")}, indent=1))


if __name__ == "__main__":
    main()
