"""Evidence for EEPO's probability-clip defaults (eps_L, eps_R of eq. 8), on the embedded default.

    python benchmarks/eepo_eps_study.py

For each (eps_L, eps_R) the same stage-1 samples (fixed seed, 32 prompts x G/2 = 4) get one unlearning step with
the paper's eta = 3e-3, then stage 2 is sampled. Reported: the fraction of stage-1 tokens whose p lies above
1 - eps_R (their gradient is zero: the step cannot touch them), the mean change of the stage-1 sequence
log-probs caused by the step (negative = the step did its job), stage-2 entropy and accuracy (stays usable?).
Writes results/eepo_eps_study/eepo_eps_study.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from trl_variants import EEPOConfig, EEPOTrainer, accuracy_reward, load_default_dataset
from trl_variants.default import DEFAULT_MODEL_PATH

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = [(1e-6, 1e-4), (1e-6, 1e-3), (1e-6, 1e-2), (1e-6, 0.05), (1e-6, 0.1), (1e-6, 0.2), (1e-3, 1e-3)]


def run(eps_low, eps_high, eta, ds, out_dir):
    args = EEPOConfig(output_dir=out_dir, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                      per_device_train_batch_size=32, num_generations=8, max_completion_length=56,
                      entropy_gate="always", unlearning_lr=eta, unlearning_eps_low=eps_low,
                      unlearning_eps_high=eps_high, seed=0)
    trainer = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args, train_dataset=ds)
    trainer.model.train()
    tok = trainer.processing_class
    prompts = tok.apply_chat_template(list(ds["prompt"]), add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
    rows = [p for p in prompts for _ in range(8)]
    torch.manual_seed(0)
    comps, _ = trainer._generate_single_turn(rows, None, {}, 8)
    old = trainer.part("eepo_two_stage_rollout").pending_old_logps
    stage1 = [i for i in range(len(rows)) if i % 8 < 4]
    stage2 = [i for i in range(len(rows)) if i % 8 >= 4]
    p1 = [math.exp(x) for i in stage1 for x in old[i]]
    texts2 = tok.batch_decode([comps[i] for i in stage2], skip_special_tokens=True)
    acc2 = accuracy_reward(texts2, [ds[i // 8]["solution"] for i in stage2])
    m = trainer._metrics["train"]
    return {
        "clipped_high": sum(p > 1 - eps_high for p in p1) / len(p1),
        "logp_change": m["eepo/stage1_logp_change"][-1],
        "entropy1": m["eepo/entropy_stage1"][-1],
        "entropy2": m["eepo/entropy_stage2"][-1],
        "acc2": sum(acc2) / len(acc2),
    }


def main():
    torch.set_num_threads(2)
    ds = load_default_dataset(n_train=32, n_test=1, seed=5)["train"]
    out = ROOT / "outputs" / "eepo-eps"
    lines = ["| eps_L | eps_R | eta | stage-1 tokens with p > 1 - eps_R | stage-1 seq log-prob change | "
             "entropy stage 1 -> 2 | stage-2 accuracy |", "|---|---|---|---|---|---|---|"]
    for eta in (3e-3, 3e-2):
        for eps_low, eps_high in SETTINGS:
            r = run(eps_low, eps_high, eta, ds, str(out))
            lines.append(f"| {eps_low:g} | {eps_high:g} | {eta:g} | {r['clipped_high']:.1%} | {r['logp_change']:+.4f} | "
                         f"{r['entropy1']:.3f} -> {r['entropy2']:.3f} | {r['acc2']:.1%} |")
            print(lines[-1], flush=True)
    path = ROOT / "results" / "eepo_eps_study" / "eepo_eps_study.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
