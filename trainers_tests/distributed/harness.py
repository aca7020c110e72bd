"""Train one trainer for a few steps on a fixed GLOBAL batch and write what it logged and its final weights, so that a
run on 1 process and a run on N processes can be compared.

    torchrun --nproc_per_node N trainers_tests/distributed/harness.py TRAINER OUT_DIR
    accelerate launch --config_file configs/accelerate/zero2.yaml trainers_tests/distributed/harness.py TRAINER OUT

(On a machine without a GPU, an FSDP config runs FSDP2 over gloo: ``_fsdp_on_cpu``.) Switches in the environment:
HARNESS_DTYPE, HARNESS_OPTIM, HARNESS_GA (gradient accumulation steps, the global batch kept), HARNESS_CHECKPOINTS=1
(a checkpoint every step), HARNESS_RESUME=<checkpoint> (resume from it), HARNESS_SAVE_MODEL=1 (also trainer.save_model to OUT_DIR/saved), HARNESS_HELDOUT=1 (held-out evaluation during
training, ``HeldOutCallback``, logged), HARNESS_EEPO_READ=1 (``eepo``: the paper's gate, log-probs read while
generating), HARNESS_GROUPED_HOOKS=first_only (FSDP2's grouped units as torch 2.11 runs them);
HARNESS_GC / HARNESS_PEFT / HARNESS_REENTRANT for the ``*_peft`` variants.

What is held fixed across process counts: the global batch (``per_device_train_batch_size = GLOBAL_ROWS / N``), the
data order (TRL's seeded RepeatSampler over the global batch), the seed, and the completions. Sampling in a batched
``generate`` call draws the random numbers of all rows together, so the same prompt gets other tokens when the rows
are split differently over processes; here each row is generated alone, with a seed that is a function of the prompt,
its occurrence in the call, and the call count (``_per_row_generate``). Everything else is the library's own code.

Rank 0 writes ``OUT_DIR/log_history.json`` and ``OUT_DIR/model.safetensors``; every rank writes
``OUT_DIR/rank<r>.json`` with what it observed (EEPO: a digest of each temporary rollout model).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GLOBAL_ROWS = 16  # completions per optimizer step, all processes together
MAX_STEPS = 3
OPTIM = os.environ.get("HARNESS_OPTIM", "sgd")  # see test_equivalence.py for why not AdamW
LR = 0.01 if OPTIM == "sgd" else 1e-3
DTYPE = os.environ.get("HARNESS_DTYPE", "float64")  # see test_equivalence.py for why not float32


PHASE = {"name": "init", "seen": {}}  # "init" (the offline pass), then the global step of the rollout


def _per_row_generate():
    """Patch ``generate`` of every transformers model: each row alone, seeded by (phase, prompt, occurrence of the
    prompt in the phase). A prompt is sampled on one process only (whole groups per process; offline-pass shards),
    so the seed of every completion is the same whatever the number of processes."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        seen = PHASE["seen"]
        copies = generation_config.num_return_sequences or 1
        one = copy.deepcopy(generation_config)
        one.num_return_sequences = 1
        rows, prompts = [], []
        for ids, mask in zip(input_ids, attention_mask, strict=True):
            prompt = ids[mask.bool()]
            key = tuple(prompt.tolist())
            for _ in range(copies):
                seen[key] = seen.get(key, -1) + 1
                phase = PHASE["name"] if PHASE.get("round", 1) == 1 else (PHASE["name"], PHASE["round"])
                digest = hashlib.sha256(repr((phase, key, seen[key])).encode()).digest()
                torch.manual_seed(int.from_bytes(digest[:4], "little"))
                out = original(self, input_ids=prompt[None], attention_mask=torch.ones_like(prompt)[None],
                               generation_config=one, **kwargs)
                rows.append(out[0, prompt.numel():])
                prompts.append(ids)
        width = max(r.numel() for r in rows)
        pad = generation_config.pad_token_id
        new = torch.stack([torch.cat([r, r.new_full((width - r.numel(),), pad)]) for r in rows])
        return torch.cat([torch.stack(prompts), new], dim=1)

    GenerationMixin.generate = generate

    # Dynamic sampling samples several rounds per step, every process the same number: a round is its own phase.
    from trl_variants.parts import PartsTrainer

    rollout = PartsTrainer._rollout

    def counted_rollout(self, inputs):
        PHASE["round"], PHASE["seen"] = PHASE.get("round", 0) + 1, {}
        return rollout(self, inputs)

    PartsTrainer._rollout = counted_rollout


def _phase_per_shard():
    """apo_lazy: the offline pass runs inside a training step, so each of its shards is its own phase (then the
    step's phase resumes): its seeds do not depend on which process samples it or on the rollouts around it. The
    same for the chunks of a held-out evaluation (HARNESS_HELDOUT), which sample through the same generator."""
    from trl_variants.presample.runner import HFGenerator

    if getattr(HFGenerator.generate, "phase_per_shard", False):
        return  # applied already (apo_lazy with HARNESS_HELDOUT)
    original = HFGenerator.generate

    def generate(self, prompt_ids, rows, config, shard_seed):
        saved = dict(PHASE)
        PHASE.update(name=("presample", shard_seed), seen={}, round=1)
        try:
            return original(self, prompt_ids, rows, config, shard_seed)
        finally:
            PHASE.clear()
            PHASE.update(saved)

    generate.phase_per_shard = True
    HFGenerator.generate = generate


def _phase_callback():
    from transformers import TrainerCallback

    class Phase(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            PHASE["name"], PHASE["seen"], PHASE["round"] = state.global_step, {}, 0
            PHASE["steps_run"] = PHASE.get("steps_run", 0) + 1  # by this process (a resumed run: only the rest)

    return Phase()


def digit_reward(completions, **kwargs):
    """A dense reward (digits in the completion / 10): every group has distinct rewards, so every step has a real
    gradient and the comparison is not between two rounding errors (accuracy alone leaves most toy groups equal)."""
    from trl_variants.rewards import completion_text

    return [sum(ch.isdigit() for ch in completion_text(c)) / 10 for c in completions]


def half_digit_reward(prompts, completions, **kwargs):
    """:func:`digit_reward` on about half of the prompts, 0 on the others: there every group is all-equal, so dynamic
    sampling drops it and refills."""
    return [0.0 if sum(map(ord, str(p))) % 2 else r for p, r in zip(prompts, digit_reward(completions), strict=True)]


def no_reward_on_some(fn):
    """``fn``, except that about a quarter of the prompts get no reward (None) from it: with every reward function so
    wrapped those prompts have no value estimate, and A*-PO's lazy stage 1 leaves their rows out of the loss."""

    def wrapped(prompts, completions, **kwargs):
        rewards = fn(prompts=prompts, completions=completions, **kwargs)
        return [None if sum(map(ord, str(p))) % 4 == 0 else r for p, r in zip(prompts, rewards, strict=True)]

    wrapped.__name__ = fn.__name__
    return wrapped


def _fsdp_on_cpu() -> None:
    """Let Accelerate run FSDP over a CPU (gloo) process group, where a launcher's FSDP config asks for it.

    Accelerate 1.15 turns on FSDP only over a GPU-type process group (``AcceleratorState`` checks for MULTI_GPU,
    MULTI_NPU, ...); on a CPU-only machine the processes are MULTI_CPU and the FSDP plugin is dropped without a word.
    torch's FSDP2 (``fully_shard``) itself runs over gloo on CPU. This lifts that one gate, and nothing else: the
    processes start as Accelerate's MULTI_CPU gloo group, then the state becomes FSDP with the launcher's plugin,
    as ``AcceleratorState`` does over GPUs, so ``prepare``, ``unwrap_model``, ``get_state_dict`` and TRL's and
    transformers' FSDP branches run their own code on sharded DTensor parameters."""
    import accelerate.state as state
    from accelerate.utils import DistributedType

    if torch.cuda.is_available() or getattr(state.AcceleratorState, "_fsdp_on_cpu", False):  # GPUs: nothing to lift;
        return  # or applied already (sitecustomize, then the harness)
    state.AcceleratorState._fsdp_on_cpu = True
    prepare_backend, init = state.PartialState._prepare_backend, state.AcceleratorState.__init__

    def cpu_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        return prepare_backend(self, True, sagemaker_dp, backend)  # gloo over CPU processes

    def fsdp_state(self, *args, **kwargs):
        init(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            if self._mixed_precision != "no":
                plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = plugin

    state.PartialState._prepare_backend = cpu_backend
    state.AcceleratorState.__init__ = fsdp_state


def _grouped_hooks_as_in_torch_2_11() -> None:
    """HARNESS_GROUPED_HOOKS=first_only: FSDP2's grouped units (``fully_shard([a, b, ...])``) as torch 2.11 runs
    them, where only the group's first module to run gets the pre-forward hook that casts the inputs to the compute
    dtype (the semantics of pytorch/pytorch#130949, which added groups; torch 2.13 runs it for each module).
    Accelerate 1.15 groups the final norm and the LM head, and the input embeddings with them when they are tied to
    the head. For testing only: on a GPU with torch 2.11 the trainers failed this way (results/gpu/README.md,
    2026-11-28); the suite's torch 2.13 cannot show it otherwise (``scripts/test_with_torch.sh`` runs torch 2.11
    itself, where this does nothing). Applied before ``fully_shard`` binds the hook."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState, TrainingState

    if not hasattr(FSDPState, "_cast_forward_inputs"):  # torch 2.11 itself (its cast is inline): nothing to reproduce
        return
    pre_forward, cast = FSDPState._pre_forward, FSDPState._cast_forward_inputs

    def first_only(self, module, args, kwargs):
        later = len(self._modules) > 1 and self._training_state == TrainingState.FORWARD
        self._harness_no_cast = later  # a later module of its group in this forward: no cast, as in torch 2.11
        try:
            return pre_forward(self, module, args, kwargs)
        finally:
            self._harness_no_cast = False

    def maybe_cast(self, args, kwargs):
        return (args, kwargs) if getattr(self, "_harness_no_cast", False) else cast(self, args, kwargs)

    FSDPState._pre_forward, FSDPState._cast_forward_inputs = first_only, maybe_cast


def _config(name: str, world: int, out: Path):
    from trainers_tests.helpers import CPU_ARGS
    from trl_variants import APOConfig, ComposedConfig, DPHConfig, EEPOConfig, ERPOConfig
    from trl_variants.composed import PART_NAMES

    accumulation = int(os.environ.get("HARNESS_GA", "1"))  # gradient accumulation steps (the global batch is kept)
    per_device = GLOBAL_ROWS // world // accumulation
    # use_cpu makes Accelerate pick plain gloo DDP: under `accelerate launch` with a DeepSpeed or FSDP config it has
    # to go, so that the launcher's backend is the one that runs (on a machine without a GPU it runs on the CPU)
    launcher_backend = "true" in (os.environ.get("ACCELERATE_USE_DEEPSPEED"), os.environ.get("ACCELERATE_USE_FSDP"))
    cpu = {k: v for k, v in CPU_ARGS.items() if k != "use_cpu" or not launcher_backend}
    if launcher_backend and not torch.cuda.is_available():
        cpu["ddp_backend"] = "gloo"  # without it Accelerate finds no backend on a CPU-only machine: N lone processes
    common = dict(cpu, output_dir=str(out / "trainer"), per_device_train_batch_size=per_device,
                  gradient_accumulation_steps=accumulation,
                  max_completion_length=24, learning_rate=LR, max_steps=MAX_STEPS, logging_steps=1, optim=OPTIM,
                  temperature=3.0)  # the toy model is so peaked that at 1.0-1.5 whole groups sample one completion
    def rehearsal(base):  # DPH-RL's rehearsal as every variant here sets it, on 40-token completions
        return dict(base, max_completion_length=40, num_presamples=4, pef_threshold=4, pef_batch_size=8 // world,
                    divergence="forward_kl", dph_coef=1.0, presample_cache_dir=str(out / "cache"))

    if name == "erpo":
        return ERPOConfig(num_generations=4, **common)
    if name == "eepo":  # HARNESS_EEPO_READ=1: the paper's gate ("auto", held open by its threshold), with stage 1's
        # entropy and stage 2's old log-probs read while generating (forced: the model is float64)
        gate = dict(entropy_gate="auto", entropy_threshold=1e3, capture_stage2_logps=True) \
            if os.environ.get("HARNESS_EEPO_READ") == "1" else dict(entropy_gate="always")
        return EEPOConfig(num_generations=4, **gate, **common)
    if name == "dph":
        # forward KL (f(u) = -log u) with eta = 1: its gradient at u = 1 is not 0 (JS's is), so from the first step
        # the rehearsed rows and the token normalisation decide the update
        return DPHConfig(num_generations=4, **rehearsal(common))
    if name.endswith("_peft"):  # on LoRA adapters with gradient checkpointing (TRL's reentrant form; HARNESS_GC=0
        # leaves it off): DPH-RL's D_pef forward is a second forward through the same adapters before one backward.
        # scripts/check_distributed_backends.py compares these under ZeRO-2/3 with DDP (docs/distributed.md)
        common = dict(common, gradient_checkpointing=os.environ.get("HARNESS_GC", "1") == "1")
        if os.environ.get("HARNESS_REENTRANT"):  # "1": reentrant checkpointing asked for (TRL forces it under
            # PEFT + ZeRO-3), "0": not
            common["gradient_checkpointing_kwargs"] = {"use_reentrant": os.environ["HARNESS_REENTRANT"] == "1"}
        if name == "grpo_peft":
            from trl import GRPOConfig

            return GRPOConfig(num_generations=4, **common)
        if name == "dph_peft":  # "correct" = a digit in the completion, so that D_pef holds prompts (accuracy: none)
            return DPHConfig(num_generations=4, correctness_reward="digit_reward", correctness_threshold=0.1,
                             require_pef=True, **rehearsal(common))
    if name in ("composed", "composed_ds"):  # every method's parts at once: ERPO's weights and Query-KL, DPH-RL's
        # rehearsal, EEPO's rollout; composed_ds adds dynamic sampling (with a reward that leaves groups all-equal)
        parts = [p for p in PART_NAMES if name == "composed_ds" or p != "dapo_dynamic_sampling"]
        # composed_ds: the paper's gate ("auto", held open by alpha) and log-probs read while generating (forced: the
        # model is float64), so stage 1's entropy and stage 2's old log-probs come from the row-by-row generate calls
        gate = dict(entropy_gate="auto", entropy_threshold=1e3, capture_stage2_logps=True) if name == "composed_ds" \
            else dict(entropy_gate="always")
        return ComposedConfig(num_generations=4, parts=parts, **gate, query_kl_coef=0.1, **rehearsal(common))
    if name == "custom_part":  # the part of docs/parts.md ("A part of your own"), as the doc writes it, alone
        from trainers_tests.composed.doc_example import doc_example

        return ComposedConfig(num_generations=4, parts=[doc_example()["SelfImitation"](coef=1.0)], **common)
    if name == "dapo_stream":  # dynamic sampling alone, on a streaming dataset: the refill reads the stream itself
        return ComposedConfig(num_generations=4, parts=["dapo_dynamic_sampling"], dynamic_sampling_max_rounds=3,
                              **common)
    if name == "apo_lazy":  # the lazy stage 1: shards of 2 prompts valued during training, 24 prompts at a time
        return APOConfig(num_generations=1, num_value_samples=4, presample_cache_dir=str(out / "cache"),
                         check_binary_rewards=False, lazy_value_pass=True, presample_shard_size=2,
                         lazy_value_chunk_size=24, **dict(common, learning_rate=10 * LR))
    if name == "apo":
        # A*-PO's regression loss starts at (r - V_hat)^2 with small residuals on the shipped model (V_hat from 4
        # samples is close to every reward): 10x the step size so that 3 steps move the weights well above the
        # comparison tolerance (asserted in test_equivalence.py)
        return APOConfig(num_generations=1, num_value_samples=4, presample_cache_dir=str(out / "cache"),
                         check_binary_rewards=False, **dict(common, learning_rate=10 * LR))
    raise ValueError(name)


def _watch_eepo_rollout_models(trainer, observed: dict) -> None:
    """Record a digest of the temporary (unlearned) rollout model: EEPO pushes weights (``_sync_vllm``) right after
    the unlearning step and again after restoring them; the first of each pair sees the unlearned model."""
    sync = trainer._sync_vllm
    digests = observed["rollout_model_digests"] = []
    toggle = {"unlearned": False}

    def watched():
        toggle["unlearned"] = not toggle["unlearned"]
        if toggle["unlearned"]:
            h = hashlib.sha256()
            for p in trainer.accelerator.unwrap_model(trainer.model).parameters():
                p = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: gathered (every rank is here)
                h.update(p.detach().cpu().numpy().tobytes())
            digests.append(h.hexdigest())
        sync()

    trainer._sync_vllm = watched


def _fsdp2_state(model) -> dict:
    """Under FSDP2: whether every parameter is back to its shard (a DTensor), and which parameter groups free their
    full weights after a forward (torch's private state: a test-only read)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from trl_variants._model import fsdp_param_groups

    groups = [g for m in model.modules() if isinstance(m, FSDPModule) for g in fsdp_param_groups(m._get_fsdp_state())]
    return {"sharded": all(isinstance(p, DTensor) for p in model.parameters()),
            "reshards_after_forward": [g.post_forward_mesh_info is not None for g in groups]}


def _watch_evaluations(trainer, observed: dict) -> None:
    """Record what each held-out evaluation saw and measured: the number of weights of the model it sampled from and
    the sum of their magnitudes (under ZeRO-3 / FSDP: the full weights, gathered), its greedy accuracy and the
    sampled completions' mean length, and (FSDP2) how many weight all-gathers ran while it sampled, in all so far
    (none: the weights were gathered before it began); under FSDP2 also the state it left (``_fsdp2_state``)."""
    from trl_variants.evaluation import callbacks

    evaluate, evaluate_policy = callbacks.evaluate, callbacks.evaluate_policy
    seen = observed["heldout"] = []
    left = observed["fsdp2_after_evaluations"] = []

    def watched_policy(*args, **kwargs):
        res = evaluate_policy(*args, **kwargs)
        if trainer.is_fsdp_enabled:
            left.append(_fsdp2_state(trainer.accelerator.unwrap_model(trainer.model)))
        return res

    callbacks.evaluate_policy = watched_policy

    gathers = {"inside": False, "count": 0}  # FSDP2's weight all-gathers while an evaluation runs (expected: none)
    if trainer.is_fsdp_enabled:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group

        all_gather = _fsdp_param_group.foreach_all_gather

        def counted(*args, **kwargs):
            gathers["count"] += gathers["inside"]
            return all_gather(*args, **kwargs)

        _fsdp_param_group.foreach_all_gather = counted

    def watched(model, *args, **kwargs):
        gathers["inside"] = True
        try:
            res = evaluate(model, *args, **kwargs)
        finally:
            gathers["inside"] = False
        params = list(model.parameters())  # after sampling, still inside the evaluation's full weights
        seen.append({"numel": sum(p.numel() for p in params),
                     "abs_sum": sum(p.detach().double().abs().sum().item() for p in params),
                     "greedy": res.get("greedy"), "mean_length": [t["mean_length"] for t in res["temperatures"].values()],
                     "weight_gathers": gathers["count"]})
        return res

    callbacks.evaluate = watched


def _watch_logps_dtypes(trainer, observed: dict) -> None:
    """Record the dtypes of the per-token log-probs the trainer scores (GRPOTrainer's forward through the model, which
    every loss here reads): under FSDP's mixed precision they came back in the compute dtype (bf16)."""
    score = trainer._get_per_token_logps_and_entropies
    dtypes = observed["logps_dtypes"] = []

    def watched(*args, **kwargs):
        logps, entropies, aux = score(*args, **kwargs)
        if str(logps.dtype) not in dtypes:
            dtypes.append(str(logps.dtype))
        return logps, entropies, aux

    trainer._get_per_token_logps_and_entropies = watched


def main(name: str, out: str) -> None:
    from accelerate import PartialState

    from trainers_tests.helpers import train_dataset
    from trl_variants import accuracy_reward
    from trl_variants.default import DEFAULT_MODEL_PATH
    from trl_variants.registry import method_classes

    torch.set_num_threads(1)
    out = Path(out)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun and accelerate launch both set it
    fsdp = os.environ.get("ACCELERATE_USE_FSDP") == "true"  # a launcher's FSDP config asked for it
    if fsdp:
        _fsdp_on_cpu()
        if os.environ.get("HARNESS_GROUPED_HOOKS") == "first_only":
            _grouped_hooks_as_in_torch_2_11()
    _per_row_generate()
    if name == "apo_lazy":
        _phase_per_shard()
    trainer_cls = method_classes({"composed_ds": "composed", "dapo_stream": "composed", "custom_part": "composed",
                                  "apo_lazy": "apo"}.get(name, name.removesuffix("_peft")))[0]
    args = _config(name, world, out)
    model = DEFAULT_MODEL_PATH  # GRPOConfig's model_init_kwargs accept no float64: load it here in that case
    if DTYPE != "float32":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=getattr(torch, DTYPE))
    rewards = [accuracy_reward, half_digit_reward if name in ("composed_ds", "dapo_stream") else digit_reward]
    if name == "apo_lazy":  # some prompts without a value estimate: the weighted loss (rows left out) is compared too
        rewards = [no_reward_on_some(f) for f in rewards]
    data = train_dataset(96 if name == "apo_lazy" else 48)
    if name == "dapo_stream":  # GRPOTrainer streams it (accelerate dispatches the batches from rank 0)
        data = data.to_iterable_dataset()
    peft = {}
    if name.endswith("_peft") and os.environ.get("HARNESS_PEFT", "1") == "1":  # HARNESS_PEFT=0: the full model
        from peft import LoraConfig

        peft["peft_config"] = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    if os.environ.get("HARNESS_CHECKPOINTS") == "1":  # a checkpoint every step, under OUT_DIR/trainer
        args.save_strategy, args.save_steps = "steps", 1
    trainer = trainer_cls(model=model, reward_funcs=rewards, train_dataset=data, args=args, **peft)
    state = PartialState()
    assert state.num_processes == world, (state.num_processes, world)
    if fsdp and not trainer.is_fsdp_enabled:
        raise RuntimeError(f"the launcher asked for FSDP but the trainer runs {state.distributed_type}")

    trainer.add_callback(_phase_callback())
    observed = {"world": world, "distributed_type": str(trainer.accelerator.distributed_type),
                "deepspeed": trainer.is_deepspeed_enabled, "fsdp": trainer.is_fsdp_enabled}
    _watch_logps_dtypes(trainer, observed)
    if name in ("eepo", "composed", "composed_ds"):
        _watch_eepo_rollout_models(trainer, observed)
    if os.environ.get("HARNESS_HELDOUT") == "1":  # held-out accuracy at the start, at step 2 and at the end, logged:
        # the processes share out its chunks (greedy and sampled: uneven numbers of forwards per process)
        from trl_variants.default import load_default_dataset
        from trl_variants.evaluation import EvalConfig, HeldOutCallback, PassAtKCallback

        _phase_per_shard()
        _watch_evaluations(trainer, observed)
        heldout = load_default_dataset(n_train=0, n_test=6)["test"]
        trainer.add_callback(HeldOutCallback(trainer, heldout, k=2, eval_steps=2, plot=False))
        # and one chunk of one sampled pass, entropies scored: a single unit of work, so one of 2 processes has none
        trainer.add_callback(PassAtKCallback(trainer, heldout, EvalConfig(k=2, temperatures=[1.0], greedy=False,
                                                                          max_completion_length=16), eval_steps=3))
    if name in ("dph", "dph_peft", "apo", "composed", "composed_ds"):  # what the offline pass produced (DPH-RL: the split it made), to compare backends
        parts = [trainer.train_dataset] + ([trainer.pef_dataset] if name != "apo" else [])
        text = json.dumps([part.to_dict() for part in parts], sort_keys=True, default=str)
        observed["offline_pass_digest"] = hashlib.sha256(text.encode()).hexdigest()
    trainer.train(resume_from_checkpoint=os.environ.get("HARNESS_RESUME") or None)  # a checkpoint of another run
    if name in ("eepo", "composed", "composed_ds"):  # whether EEPO still reads log-probs while generating (no fallback)
        observed["reads_while_generating"] = [p.capture for p in trainer.parts if p.owns_rollout][0]
    if name == "dapo_stream":  # where the refill stream stood at the end, and the rows it read
        part = trainer.part("dapo_dynamic_sampling")
        observed["refill_pos"] = part.stream.pos
    if name == "apo_lazy":  # what the lazy pass valued, and when (the same on every rank and process count)
        lazy = trainer._lazy
        observed["lazy_values"] = {str(r): v if math.isfinite(v) else None for r, v in sorted(lazy.values.items())}
        observed["lazy_steps"], observed["lazy_shards"] = lazy.steps, lazy.done
    observed["steps_run"] = PHASE.get("steps_run", 0)
    if trainer.is_fsdp_enabled:
        observed["fsdp2_at_end"] = _fsdp2_state(trainer.accelerator.unwrap_model(trainer.model))
    (out / f"rank{state.process_index}.json").write_text(json.dumps(observed))
    # the engine under DeepSpeed (ZeRO-3 gathers the shards), the DDP module or FSDP's sharded one otherwise
    state_dict = trainer.accelerator.get_state_dict(trainer.model_wrapped)  # collective; the full dict on rank 0
    if os.environ.get("HARNESS_SAVE_MODEL") == "1":  # the trainer's own final save as well, to OUT_DIR/saved
        trainer.save_model(str(out / "saved"))
    if state.is_main_process:
        from safetensors.torch import save_file

        weights = {k: v.detach().cpu().clone() for k, v in state_dict.items()}
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
        save_file(weights, str(out / "model.safetensors"))
    # every rank reaches this point before the group goes (Gloo aborts a process whose peers left first)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    print("OK", state.process_index)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)  # results are written and the group destroyed: skip the interpreter's teardown (helpers.run_two_ranks)
