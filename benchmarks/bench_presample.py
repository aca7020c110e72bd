"""Stage-1 time: trl_variants' offline reference pass vs TRL's experimental A2POTrainer stage 1, same prompts,
same N, same lengths, same prompts per generate call, interleaved in one process.

    python benchmarks/bench_presample.py [--prompts 128 --N 8 --reps 3]

Reported: median wall time of each (min-max), their ratio, and the time of a second, cached call of ours (what a
resumed or repeated run pays). Writes results/benchmarks/bench_presample.json / .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--N", type=int, default=8)
    ap.add_argument("--batch_prompts", type=int, default=8, help="prompts per generate call (x N sequences)")
    ap.add_argument("--max_completion_length", type=int, default=56)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "bench_presample"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from trl.experimental.a2po import A2POConfig, A2POTrainer

    from trl_variants import accuracy_reward, load_default_dataset
    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.presample import PresampleConfig, presample

    ds = load_default_dataset(n_train=args.prompts, n_test=1, seed=11)["train"]
    tmp = Path(tempfile.mkdtemp())
    a2po = A2POTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, train_dataset=ds, args=A2POConfig(
        output_dir=str(tmp / "a2po"), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
        per_device_train_batch_size=args.batch_prompts, num_value_samples=args.N, beta1=0.5,
        max_completion_length=args.max_completion_length, temperature=1.0, filter_all_incorrect=False))
    model, tok = a2po.ref_model, a2po.processing_class

    def ours(cache_dir, use_cache=True):
        cfg = PresampleConfig(num_samples=args.N, value_beta=0.5, max_completion_length=args.max_completion_length,
                              record_prompt_logp=False, generation_batch_size=args.batch_prompts * args.N,
                              cache_dir=str(cache_dir), use_cache=use_cache, show_progress=False)
        return presample(model, tok, ds, accuracy_reward, cfg)

    times = {"trl_variants": [], "a2po": [], "trl_variants_cached": []}
    for rep in range(args.reps):
        for name in (("trl_variants", "a2po") if rep % 2 == 0 else ("a2po", "trl_variants")):
            t0 = time.perf_counter()
            if name == "a2po":
                a2po._estimate_optimal_values()
            else:
                cache = tmp / f"cache{rep}"
                out = ours(cache)
            times[name].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ours(tmp / f"cache{rep}")
        times["trl_variants_cached"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    v_ours = sum(out["ref_value"]) / len(out)
    v_a2po = sum(a2po._optimal_values.values()) / len(a2po._optimal_values)
    result = {"settings": vars(args), "times_s": times, "median_s": med,
              "ratio_ours_over_a2po": med["trl_variants"] / med["a2po"],
              "ratio_cached_over_a2po": med["trl_variants_cached"] / med["a2po"],
              "mean_value_ours": v_ours, "mean_value_a2po": v_a2po}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1))
    lines = [f"Settings: {vars(args)}", "", "| stage 1 | median s [min-max] | ratio to A2PO |", "|---|---|---|"]
    for k in ("a2po", "trl_variants", "trl_variants_cached"):
        lines.append(f"| {k} | {med[k]:.2f} [{min(times[k]):.2f}-{max(times[k]):.2f}] | {med[k] / med['a2po']:.3f} |")
    lines += ["", f"Mean V_hat over the prompts: ours {v_ours:.3f}, A2PO {v_a2po:.3f} (different samples, same "
                  "estimator)."]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
