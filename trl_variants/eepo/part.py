"""EEPO's addition to GRPO, as a part: two-stage sample-then-forget rollouts (EEPO paper, arXiv 2510.05837, Sec. 3,
Algorithm 1; docs/algorithms.md).

For each group of G completions, in place of GRPO's sampling of the batch (the part owns the rollout):

1. sample ceil(G/2) completions per prompt from the rollout model (= current policy);
2. measure their mean token entropy H_t; H_bar = mean of the last m values (eq. 4-5) (with the gate on "auto" the
   entropy is read from ``generate``'s own forward passes where ``EEPOConfig.capture_stage2_logps`` allows, so a
   closed gate costs no forward; otherwise from the forward with gradient that step 3 needs);
3. if H_bar < alpha: ONE plain gradient step (lr eta, no momentum) on the rollout weights that lowers the probability
   of the stage-1 tokens, minimising ``mean_seq mean_tok -log(1 - clip(p, eps_L, 1 - eps_R))`` (eq. 7-11);
4. sample the other floor(G/2) completions from the updated rollout model, and score them under it (their old log-probs:
   read from the model's own forward passes while ``generate`` samples them, or a separate forward, see
   ``EEPOConfig.capture_stage2_logps``; on rollouts that will be logged, stage 1 is re-scored under it to report how
   much the step lowered it);
5. restore the weights bit for bit; then GRPO's update on all G completions as usual, each row's old log-probs (and,
   with vLLM, its sampler/trainer importance-sampling correction) taken against the weights that sampled it.

The temporary gradient is that of this process's share of the mean over ALL stage-1 sequences of the global batch,
summed over processes, so every process applies the same step (docs/distributed.md): ``torch.autograd.grad`` on the
unwrapped module (nothing is accumulated into ``.grad``, no DDP hook fires, the optimizer never sees it), or under
FSDP2 FSDP's own backward into the shards' ``.grad``, put back afterwards (:func:`unlearning_gradient`).
"""

from __future__ import annotations

import collections
import contextlib
import warnings

import torch
from trl.trainer.utils import nanmax, nanmin

from .. import losses
from .._citations import EEPO
from .._model import drop_gathered_weights, is_peft_model, params_sharded
from .._numerics import mixed_precision
from ..parts import Part, register_part
from .losses import vllm_importance_sampling_ratio
from .unlearning import fsdp2_sharded, share_of_step_kept, unlearning_gradient


def _interleave(idx1, idx2, a1, a2, b1, b2):
    n = len(idx1) + len(idx2)
    a, b = [None] * n, None if b1 is None or b2 is None else [None] * n
    for k, i in enumerate(idx1):
        a[i] = a1[k]
        if b is not None:
            b[i] = b1[k]
    for k, i in enumerate(idx2):
        a[i] = a2[k]
        if b is not None:
            b[i] = b2[k]
    return a, b


def stage_rows(n_rows: int, G: int) -> tuple[list[int], list[int], int]:
    """EEPO's split of a batch of groups of G consecutive rows: the rows of stage 1 (the first ceil(G/2) of each
    group: the larger half when G is odd, as it also feeds the entropy gate), those of stage 2, and ceil(G/2)."""
    k1 = (G + 1) // 2
    return [i for i in range(n_rows) if i % G < k1], [i for i in range(n_rows) if i % G >= k1], k1


def _rollout_is_logged(trainer) -> bool:
    """Whether a log falls within the optimizer steps this rollout feeds. Re-scoring stage 1 under the unlearned
    weights only feeds a metric, so it is done on those rollouts only (the same decision on every process)."""
    args = trainer.args
    if args.logging_strategy != "steps":
        return True
    every = int(args.logging_steps if args.logging_steps >= 1 else trainer.state.logging_steps)
    step = trainer.state.global_step
    fed = max(1, args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps)
    return (args.logging_first_step and step == 0) or any((step + k) % every == 0 for k in range(1, fed + 1))


class _LogpsWhileGenerating(contextlib.AbstractContextManager):
    """The log-probs and entropies of the tokens ``generate`` picks, read from the model's own forward passes while
    it samples: at each decoding step, ``log_softmax(logits / T)`` of the last position (the model's distribution,
    before any logits processor: what a separate forward gives), gathered at the token the next step feeds back
    (the last step's token is read from the completions). Holds one ``(batch, vocab)`` row block at a time. Several
    ``generate`` calls inside one context (e.g. a generation path that samples row by row) are read one after the
    other: a pass whose KV cache holds only its own tokens starts a new call, whose rows follow the previous ones."""

    def __init__(self, module, temperature: float, passes_after_end: bool = False):
        self.module, self.temperature = module, temperature
        self.passes_after_end = passes_after_end  # generate may run passes after a call's last token (see below)
        self.calls: list[dict] = []  # per generate call: logps, entropies, fed (lists of (rows,) tensors), last
        self.unreadable = False  # a pass without token ids or logits (e.g. embeddings fed in): score separately

    def __enter__(self):
        self._handle = self.module.register_forward_hook(self._read, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False

    @staticmethod
    def _first_pass(kwargs, ids) -> bool:
        """A generate call's first (prefill) pass: after it, its KV cache holds exactly the tokens it was fed (the
        cache is ``cache=`` from transformers 5.x's rename on, ``past_key_values=`` before)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        length = getattr(cache, "get_seq_length", None)
        return length is not None and length() == ids.size(1)

    def _read(self, module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        logits = getattr(output, "logits", None)
        if ids is None or logits is None or self.unreadable:
            self.unreadable = True
            return
        if not self.calls or self._first_pass(kwargs, ids):
            self.calls.append({"logps": [], "entropies": [], "fed": [], "last": None})
        call = self.calls[-1]
        last = call["last"]
        if last is not None:
            if last.size(0) != ids.size(0):
                self.unreadable = True
                return
            token = ids[:, -1:].to(last.device)  # the LM head may sit on another device (device_map)
            call["fed"].append(token.squeeze(-1))
            call["logps"].append(last.gather(-1, token).squeeze(-1))
        step = logits[:, -1]
        step = step.float() if step.dtype in (torch.float16, torch.bfloat16) else step
        logps = torch.log_softmax(step / self.temperature, dim=-1)
        call["entropies"].append(-(logps.exp() * logps).sum(-1))
        call["last"] = logps

    def scores(self, completions):
        """``(logps, entropies, mask)`` of ``completions`` (rows in generation order), padded like
        ``trainer._score``; None when the passes seen do not match the completions (then score them separately)."""
        if self.unreadable or not self.calls:
            return None
        parts, row = [], 0
        for call in self.calls:
            rows = call["last"].size(0)
            part = self._call_scores(call, completions[row:row + rows], self.passes_after_end)
            if part is None:
                return None
            parts.append(part)
            row += rows
        if row != len(completions):
            return None
        width = max(len(c) for c in completions)
        return tuple(torch.cat([torch.nn.functional.pad(p[k], (0, width - p[k].size(1))) for p in parts])
                     for k in range(3))

    @staticmethod
    def _call_scores(call, completions, passes_after_end: bool = False):
        """One generate call's ``(logps, entropies, mask)``, or None (e.g. beam search: several hypotheses per row).

        ``passes_after_end``: passes after the last token (more passes than completion tokens) are expected, where
        ``generate`` goes on after this call's rows have all finished: under FSDP / ZeRO-3 with several processes
        (``synced_gpus``: every process steps until all are done) and with a deferred stop check (transformers on
        MPS). The first of them fed the last token back, which gives its log-prob; the others see nothing of the
        completions and are left out. Elsewhere such passes mean another generation path: None."""
        steps, width = len(call["entropies"]), max((len(c) for c in completions), default=0)
        last = call["last"]
        if steps < width or steps > width and not passes_after_end or width == 0 or last.size(0) != len(completions):
            return None
        ids = torch.zeros(len(completions), width, dtype=torch.long, device=last.device)
        mask = torch.zeros(len(completions), width, dtype=torch.long, device=last.device)
        for i, c in enumerate(completions):
            ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            mask[i, : len(c)] = 1
        fed = call["fed"][:width]  # width - 1 tokens fed back, or width when a pass came after the last token
        if fed and not torch.equal(torch.stack(fed, 1) * mask[:, : len(fed)], ids[:, : len(fed)] * mask[:, : len(fed)]):
            return None  # the tokens fed back are not the completions' (another generation path)
        read = call["logps"][:width]
        if len(read) < width:  # no pass after the last token: its log-prob from the last pass's distribution
            read = [*read, last.gather(-1, ids[:, -1:]).squeeze(-1)]
        return torch.stack(read, dim=1) * mask, torch.stack(call["entropies"][:width], dim=1) * mask, mask


STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rotary embeddings that do not depend on the sequence length


def _relative_positions(config) -> bool:
    """Whether the model sees only relative positions (static rotary embeddings): then the positions ``generate``
    gives a left-padded row (counted from its first real token) and those of a training forward (counted from the
    first pad) give the same values. Absolute position embeddings (GPT-2 style) and length-dependent RoPE do not."""
    rope = getattr(config, "rope_parameters", None)
    if not isinstance(rope, dict) or not rope:
        return False
    kinds = [v.get("rope_type", "default") for v in rope.values()] if all(isinstance(v, dict) for v in rope.values()) \
        else [rope.get("rope_type", "default")]
    return all(kind in STATIC_ROPE for kind in kinds)


def _dropout_active(model) -> bool:
    """Whether a forward in train mode is random (dropout left on: GRPOConfig.disable_dropout=False and p > 0)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = model.config.get_text_config().to_dict()
    return any(isinstance(v, float) and v > 0 for k, v in config.items() if "dropout" in k)


def _captures_stage2(trainer) -> bool:
    """Whether stage 2's old log-probs are read while generating (``EEPOConfig.capture_stage2_logps``): by default
    only where that gives a separate forward's values (a static KV cache, GRPOConfig's ``cache_implementation=
    "static"``, does: ``generate`` still runs the trainer's module one step at a time; continuous batching does not,
    :meth:`TwoStageRollout.setup` says so)."""
    args = trainer.args
    if args.capture_stage2_logps is not None:
        return args.capture_stage2_logps
    if trainer.use_vllm or trainer.use_transformers_continuous_batching or mixed_precision(args):
        return False
    if (getattr(trainer.generation_config, "num_beams", 1) or 1) > 1:  # beams: the passes score hypotheses
        return False
    model = trainer.accelerator.unwrap_model(trainer.model)
    return (all(p.dtype == torch.float32 for p in model.parameters())
            and _relative_positions(model.config.get_text_config()) and not _dropout_active(model))


def _separate_forward_reason(trainer) -> str | None:
    """Why the default (``capture_stage2_logps=None``) scores stage 2 in a separate forward, when the reason is a
    setting a user may not expect to cost a forward (said once by :meth:`TwoStageRollout.setup`); None otherwise."""
    args = trainer.args
    if trainer.use_transformers_continuous_batching:
        return ("under use_transformers_continuous_batching: transformers' continuous batching engine runs the model "
                "on packed batches of its own scheduling, not on the rows the read follows")
    if mixed_precision(args):
        return (f"with {mixed_precision(args)} compute: the decoding steps' logits round differently from "
                "a forward over the whole sequence, so the default keeps the forward's values (set "
                "capture_stage2_logps=True to read them anyway, within that rounding)")
    return None


@register_part
class TwoStageRollout(Part):
    """The rollout of eq. 4-11. The part holds the gate's state ``entropy_history`` (checkpointed through :meth:`state`)
    and, between the rollout and its scoring, ``pending_old_logps`` / ``pending_stage2``. Metrics:
    ``eepo/entropy_stage1``, ``eepo/entropy_moving_avg``, ``eepo/gate``, ``eepo/unlearning_loss``,
    ``eepo/entropy_stage2``, ``eepo/stage1_logp_change``, ``eepo/unlearning_step_kept`` (:func:`share_of_step_kept`)."""

    name = "eepo_two_stage_rollout"
    citation, tag = EEPO, "eepo"  # model cards
    owns_rollout = True

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        for unsupported in ("tools", "environment_factory", "rollout_func"):
            if kwargs.get(unsupported) is not None:
                raise ValueError(f"{trainer_name} does not support {unsupported}= (two-stage rollouts are single-turn)")

    def setup(self, trainer) -> None:
        args = trainer.args
        if args.entropy_gate != "never" and params_sharded(trainer) and not fsdp2_sharded(trainer):
            raise ValueError("EEPO's unlearning step edits the parameters in place: it supports DDP, ZeRO-1/2, FSDP2 "
                             "and PEFT, not ZeRO-3 or FSDP1 (use zero2.yaml or fsdp2.yaml, or entropy_gate='never')")
        every = args.steps_per_generation * args.num_iterations
        if args.entropy_gate != "never" and fsdp2_sharded(trainer) and every % args.gradient_accumulation_steps:
            raise ValueError(
                f"EEPO under FSDP2 takes its unlearning step at the start of a gradient-accumulation cycle, but a "
                f"rollout every steps_per_generation x num_iterations = {every} micro-steps falls inside cycles of "
                f"gradient_accumulation_steps = {args.gradient_accumulation_steps} (FSDP would reduce the cycle's "
                "training gradient with it): make steps_per_generation x num_iterations a multiple of "
                "gradient_accumulation_steps (TRL's default steps_per_generation is)")
        self.window = args.entropy_window
        self.entropy_history = collections.deque(maxlen=self.window)
        self._rounds_batch, self._rounds = None, []  # the generation batch the last entry averages, its rounds
        self.pending_old_logps = None  # per row, set by an unlearning rollout
        self.pending_stage2 = None  # that rollout's stage-2 rows
        self.capture = _captures_stage2(trainer)
        reason = _separate_forward_reason(trainer) if args.capture_stage2_logps is None else None
        if reason and args.entropy_gate != "never":
            warnings.warn(f"EEPO: stage 2's old log-probs (and, with entropy_gate='auto', stage 1's entropy) are not "
                          f"read while generating {reason}. They are scored in a separate no-grad forward instead "
                          "(one more forward per rollout). Set capture_stage2_logps=False to choose that explicitly "
                          "and silence this warning", stacklevel=2)

    # ------------------------------------------------------------------------------------ checkpoint state ---
    def state(self) -> dict:
        return {"entropy_history": list(self.entropy_history)}

    def load_state(self, state: dict) -> None:
        self.entropy_history = collections.deque(state["entropy_history"], maxlen=self.window)
        self._rounds_batch, self._rounds = None, []

    def _record_entropy(self, batch: int, h_t: float) -> None:
        """The moving average's window counts generation batches (the gate's m, ``entropy_window``): a batch sampled
        in several rounds (DAPO's dynamic sampling refills it) is one entry, the mean of its rounds' stage-1
        entropies. One entry per round made the window of m = 3 span the last rounds of a single batch.
        ``batch``: the trainer's ``generation_batch_index`` (None: a rollout called on its own, an entry each)."""
        if batch is not None and self._rounds_batch == batch and self.entropy_history:
            self._rounds.append(h_t)
            self.entropy_history[-1] = sum(self._rounds) / len(self._rounds)
        else:
            self._rounds_batch, self._rounds = batch, [h_t]
            self.entropy_history.append(h_t)

    # ------------------------------------------------------------------------------------------ the rollout ---
    def generate(self, trainer, grpo_generate, prompt_ids, images, multimodal_fields, num_generations,
                 has_tool_images=False):
        self.pending_old_logps = self.pending_stage2 = None
        if not trainer.model.training or trainer.args.entropy_gate == "never":
            return grpo_generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        if images is not None or multimodal_fields:
            raise ValueError(f"{type(trainer).__name__}: EEPO's two-stage rollout (part {self.name!r}) supports "
                             "text-only models")
        G = trainer.num_generations
        stage1, stage2, k1 = stage_rows(len(prompt_ids), G)
        k2 = G - k1
        p1, p2 = [prompt_ids[i] for i in stage1], [prompt_ids[i] for i in stage2]

        # 1. stage 1 from the current policy (k1 consecutive copies of each prompt, as vLLM server mode expects)
        model = trainer.accelerator.unwrap_model(trainer.model)
        read_stage1 = trainer.args.entropy_gate == "auto"
        with self._reader(trainer, model) if read_stage1 else contextlib.nullcontext() as reader:
            c1, lp1 = grpo_generate(p1, None, {}, k1)  # "auto": read while generating, a closed gate needs no forward
        read1 = self._read(trainer, reader, c1, stage=1)
        # 2. entropy gate: stage 1's entropy read while generating it, or from the forward with grad whose log-probs
        #    feed the unlearning loss (then that forward also serves the gate)
        logps1 = None
        if read1 is None:
            with torch.enable_grad():
                logps1, ent1, mask1 = trainer._score(model, p1, c1, entropy=True)
        else:
            _, ent1, mask1 = read1
        h_t = trainer.global_mean(ent1.detach(), mask1)
        self._record_entropy(getattr(trainer, "generation_batch_index", None), h_t)
        h_bar = sum(self.entropy_history) / len(self.entropy_history)
        unlearn = trainer.args.entropy_gate == "always" or h_bar < trainer.args.entropy_threshold
        metrics = trainer._metrics["train"]
        metrics["eepo/entropy_stage1"].append(h_t)
        metrics["eepo/entropy_moving_avg"].append(h_bar)
        metrics["eepo/gate"].append(float(unlearn))
        if not unlearn:
            c2, lp2 = grpo_generate(p2, None, {}, k2)
            return _interleave(stage1, stage2, c1, c2, lp1, lp2)

        # 3. one plain gradient step on the rollout weights, lowering p(stage-1 tokens): the gradient of the loss
        #    over ALL stage-1 sequences of the global batch (mean over sequences), summed over processes, so that
        #    every process holds the same unlearned model
        if logps1 is None:  # the gate was read while generating: the forward with grad only now that it is needed
            with torch.enable_grad():
                logps1, _, mask1 = trainer._score(model, p1, c1)
        seq_terms, has_tokens = losses.unlearning_sequence_terms(
            logps1, mask1, trainer.args.unlearning_eps_low, trainer.args.unlearning_eps_high)
        n_sequences = trainer.accelerator.reduce(has_tokens.sum().to(seq_terms.dtype).detach(), "sum").clamp(min=1.0)
        u = (seq_terms * has_tokens).sum() / n_sequences  # this process's share of the global mean
        params, grads = unlearning_gradient(trainer, model, u)  # (under FSDP2 the shards, read after the backward)
        snapshot = [p.detach().clone() for p in params]
        before1 = logps1.detach()  # stage-1 log-probs under the policy: the stage-1 old log-probs
        del logps1
        measure_drop = _rollout_is_logged(trainer)
        try:
            with torch.no_grad():
                for p, g in zip(params, grads, strict=True):
                    if g is not None:
                        p.sub_(trainer.args.unlearning_lr * g)
                reduce = (lambda t: trainer.accelerator.reduce(t.to(trainer.accelerator.device), "sum").cpu()) \
                    if fsdp2_sharded(trainer) else None
                kept = share_of_step_kept(params, snapshot, grads, trainer.args.unlearning_lr, reduce) \
                    if measure_drop else None
            del grads
            drop_gathered_weights(trainer, model)
            trainer._sync_vllm()
            # 4. stage 2 from the unlearned rollout model, scored under it (its old log-probs and entropy): read
            #    while generating, or in a separate forward; on rollouts that will be logged stage 1 is re-scored
            #    under it too (how much the step lowered it)
            with self._reader(trainer, model) as reader:
                c2, lp2 = grpo_generate(p2, None, {}, k2)
            captured = self._read(trainer, reader, c2, stage=2)
            rescored_p, rescored_c = ([], []) if captured is not None else (p2, c2)
            if measure_drop:
                rescored_p, rescored_c = rescored_p + p1, rescored_c + c1
            after = None
            if rescored_p:
                with torch.no_grad():
                    after, ent, mask = trainer._score(model, rescored_p, rescored_c, entropy=True)
        finally:
            # 5. restore, bit for bit
            with torch.no_grad():
                for p, saved in zip(params, snapshot, strict=True):
                    p.copy_(saved)
            drop_gathered_weights(trainer, model)
            trainer._sync_vllm()
        if captured is None:  # rows [:n2] of the forward are stage 2 (columns past their completions are masked out)
            n2 = len(p2)
            old2, mask2, ent2 = after[:n2], mask[:n2], ent[:n2]
        else:
            n2 = 0
            old2, ent2, mask2 = captured
        metrics["eepo/unlearning_loss"].append(trainer.accelerator.reduce(u.detach(), "sum").item())
        metrics["eepo/entropy_stage2"].append(trainer.global_mean(ent2, mask2))
        if measure_drop:
            after1 = after[n2:, : mask1.size(1)]
            drop = ((after1 - before1) * mask1).sum(-1)
            metrics["eepo/stage1_logp_change"].append(trainer.accelerator.gather(drop).mean().item())
            if kept is not None:
                metrics["eepo/unlearning_step_kept"].append(kept)
        # old log-probs: stage 1 under the policy (= the pre-step weights), stage 2 under the unlearned weights
        rows1 = [lp[m.bool()].tolist() for lp, m in zip(before1, mask1, strict=True)]
        rows2 = [lp[m.bool()].tolist() for lp, m in zip(old2, mask2, strict=True)]
        self.pending_old_logps = _interleave(stage1, stage2, rows1, rows2, None, None)[0]
        self.pending_stage2 = stage2
        return _interleave(stage1, stage2, c1, c2, lp1, lp2)

    def _reader(self, trainer, model):
        """What reads log-probs while ``generate`` samples (nothing when this rollout does not read them)."""
        if not self.capture:
            return contextlib.nullcontext()
        accelerator = trainer.accelerator  # synced_gpus (sharded weights, several processes) or a late stop (MPS)
        late = accelerator.num_processes > 1 and params_sharded(trainer) or accelerator.device.type == "mps"
        return _LogpsWhileGenerating(model.get_base_model() if is_peft_model(model) else model,
                                     trainer.temperature, passes_after_end=late)

    def _read(self, trainer, reader, completions, stage: int):
        """``(logps, entropies, mask)`` read while generating ``completions``, or None: not read, or (warned once,
        then never tried again) a generation path whose passes do not match the completions. Every process decides
        alike (if one cannot read, none keeps what it read): the separate forwards that replace the reading are
        collectives under FSDP, where processes deciding apart would wait for each other for ever."""
        if reader is None:  # not read (nullcontext): capture off, or stage 1 under a gate other than "auto"
            return None
        scores = reader.scores(completions)
        accelerator = trainer.accelerator
        if accelerator.num_processes > 1:
            unread = torch.tensor(float(scores is None), device=accelerator.device)
            if accelerator.reduce(unread, "sum").item() > 0:
                scores = None
        if scores is None:
            self.capture = False
            warnings.warn(f"EEPO: the forward passes seen while generating stage {stage} do not match its completions "
                          "(another generation path); stages 1 and 2 are scored in separate forwards from now on "
                          "(capture_stage2_logps=False does so without trying)", stacklevel=3)
        return scores

    def after_rollout(self, trainer, inputs, output) -> None:
        """Each row's old log-probs (and, with vLLM, its sampler/trainer correction) taken against the weights that
        sampled it: stage 1 the policy (TRL's own values), stage 2 the unlearned model."""
        rows, stage2 = self.pending_old_logps, self.pending_stage2
        self.pending_old_logps = self.pending_stage2 = None
        if rows is None:  # no unlearning step: every row came from the policy, TRL's output is right as is
            return
        old = torch.zeros_like(output["completion_ids"], dtype=torch.float32)
        for i, r in enumerate(rows):
            old[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
        if output.get("old_per_token_logps") is not None:  # TRL scored every row under the policy: keep stage 1
            trl_old, idx = output["old_per_token_logps"], torch.tensor(stage2, device=old.device)
            trl_old[idx] = old[idx].to(trl_old.dtype)
            old = trl_old
        output["old_per_token_logps"] = old
        if "importance_sampling_ratio" in output:  # vLLM: stage 2 was sampled by the engine holding unlearned weights
            self._correct_stage2_sampling(trainer, output, stage2)

    def _correct_stage2_sampling(self, trainer, output, stage2):
        """vLLM's sampler/trainer correction of the stage-2 rows, against the model that sampled them.

        TRL computed ``exp(old - sampling)`` with ``old`` under the policy for every row. Stage 1 was sampled by the
        engine holding the policy: TRL's ratio stays. Stage 2 was sampled by the engine holding the unlearned
        weights, so its ratio is recomputed from its old log-probs under those weights (same mode and bounds,
        ``eepo.losses.vllm_importance_sampling_ratio``), and TRL's ``sampling/*`` metrics are recomputed to describe the
        ratios actually applied (same definitions and cross-process aggregation as TRL's)."""
        idx = torch.tensor(stage2, device=output["completion_mask"].device)
        old, sampling, mask = output["old_per_token_logps"], output["sampling_per_token_logps"], output["completion_mask"]
        ratio = output["importance_sampling_ratio"]
        ratio[idx] = vllm_importance_sampling_ratio(
            old[idx], sampling[idx], mask[idx], trainer.vllm_importance_sampling_mode,
            trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max).to(ratio.dtype)

        def min_mean_max(x):
            return torch.stack([x.min(), x.mean(), x.max()]) if x.numel() else torch.zeros(3, device=x.device)

        delta = (old - sampling).abs()[mask.bool()]
        sequence_level = trainer.vllm_importance_sampling_mode.startswith("sequence")
        stats = torch.cat([min_mean_max(delta[~delta.isnan()]),
                           min_mean_max(ratio.flatten() if sequence_level else ratio[mask.bool()])])
        stats = trainer.accelerator.gather(stats[None].float()).view(-1, 6)  # one row per process
        metrics = trainer._metrics["train"]
        for name, value in (("sampling/sampling_logp_difference/mean", stats[:, 1].mean()),
                            ("sampling/sampling_logp_difference/max", stats[:, 2].max()),
                            ("sampling/importance_sampling_ratio/min", nanmin(stats[:, 3])),
                            ("sampling/importance_sampling_ratio/mean", stats[:, 4].nanmean()),
                            ("sampling/importance_sampling_ratio/max", nanmax(stats[:, 5]))):
            metrics[name][-1] = value.item()  # TRL appended this rollout's value last

