"""DAPO's dynamic sampling as a part (Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476, Sec. 3.2, eq. 11 and Algorithm 1 line 6).

The algorithm box, top to bottom (:meth:`DynamicSampling.fill`):

1. Sample and score the generation batch as GRPO does (one *round*).
2. A group (the G completions of one prompt) has a learning signal when its rewards are not all equal
   (:func:`groups_with_signal`): all-correct and all-wrong groups have zero advantage and are dropped.
3. While the batch holds fewer groups with a signal than it has places, draw the next prompts of a second seeded pass
   over the training set (:class:`RefillStream`; a streaming dataset is read through a seeded shuffle buffer) and
   sample them (another round), at most ``max_rounds`` rounds.
4. Fill the batch with the first kept groups in sampling order; if the bound was reached first, complete it with
   dropped groups whose completions are masked out of the loss (the step trains on what there is).

Decisions are taken on the rewards of every process (GRPO gathers them), and the rows are then sent to the process
that trains them, so the same groups are kept whatever the number of processes.
"""

from __future__ import annotations

import itertools
import logging

import torch
from accelerate.utils import gather_object
from datasets import IterableDataset

from .._citations import DAPO
from ..parts import Part, register_part
from ..presample.metadata import CORRECT_AT

logger = logging.getLogger(__name__)

REFILL_SHUFFLE_BUFFER = 1000  # rows a streaming training set's refill pass shuffles among (datasets' default)
PROMPT_KEYS = ("prompt_ids", "prompt_mask")  # left-padded: the rest of a batch's 2-D tensors follow the completion


def _varies(values: torch.Tensor) -> torch.Tensor:
    """For each row of ``values`` (groups x G, NaN = no reward): are at least two of its rewards different?"""
    nan = torch.isnan(values)
    hi = torch.where(nan, -torch.inf, values).amax(dim=1)
    lo = torch.where(nan, torch.inf, values).amin(dim=1)
    return hi > lo


def groups_with_signal(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int,
                       aggregation: str = "sum_then_normalize") -> torch.Tensor:
    """DAPO's keep rule, one bool per group of ``num_generations`` consecutive rows: the group's rewards are not all
    equal, so GRPO gives it a non-zero advantage. With ``sum_then_normalize`` (TRL's default) the rewards are the
    weighted sum over the reward functions; with ``normalize_then_sum`` a group has a signal when any one function
    varies in it. Rows without any reward (NaN) are left out; a group with fewer than two scored rows has none."""
    if aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        return torch.stack([_varies(grouped[:, :, k]) for k in range(grouped.size(2))], dim=1).any(dim=1)
    return _varies(weighted_rewards(rewards_per_func, weights).view(-1, num_generations))


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row's weighted reward sum, NaN where no function scored it (as GRPO logs ``reward``)."""
    rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


class RefillStream:
    """A second seeded pass over the training set, the same on every process: ``take(n)`` returns the indices of
    the next ``n`` prompts (epoch after epoch, each a fresh permutation); ``rows(dataset, n)`` their rows, also of a
    streaming ``IterableDataset`` (read in order through ``dataset.shuffle(seed, buffer_size)``, one seed per
    epoch). Its position (epoch, rows read in it) is checkpointed."""

    def __init__(self, seed: int):
        self.seed, self.epoch, self.pos = seed, 0, 0
        self._order: tuple[int, int, list[int]] | None = None  # (epoch, size, permutation)
        self._reader: tuple[int, int, object] | None = None  # a stream's (epoch, pos, iterator standing at pos)

    def _epoch_seed(self) -> int:
        return self.seed * 1_000_033 + 7 + self.epoch

    def order(self, size: int) -> list[int]:
        if self._order is None or self._order[:2] != (self.epoch, size):
            g = torch.Generator().manual_seed(self._epoch_seed())
            self._order = (self.epoch, size, torch.randperm(size, generator=g).tolist())
        return self._order[2]

    def rows(self, dataset, n: int) -> list[dict]:
        """The rows of the next ``n`` prompts."""
        if not isinstance(dataset, IterableDataset):
            return [dataset[i] for i in self.take(len(dataset), n)]
        out: list[dict] = []
        while len(out) < n:
            if self._reader is None or self._reader[:2] != (self.epoch, self.pos):  # start, new epoch, resumed
                shuffled = dataset.shuffle(seed=self._epoch_seed(), buffer_size=REFILL_SHUFFLE_BUFFER)
                self._reader = (self.epoch, self.pos, itertools.islice(iter(shuffled), self.pos, None))
            row = next(self._reader[2], None)
            if row is None:  # the stream ended: the next epoch
                if self.pos == 0:
                    raise ValueError("dynamic sampling: the streaming train_dataset yields no rows to refill from")
                self.epoch, self.pos = self.epoch + 1, 0
                continue
            out.append(row)
            self.pos += 1
            self._reader = (self.epoch, self.pos, self._reader[2])
        return out

    def take(self, size: int, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            chunk = self.order(size)[self.pos: self.pos + n - len(out)]
            out += chunk
            self.pos += len(chunk)
            if self.pos >= size:
                self.epoch, self.pos = self.epoch + 1, 0
        return out


def _turn_off(args) -> str:
    """How to run without dynamic sampling: a composed run lists its parts, the method trainers have the flag."""
    if isinstance(getattr(args, "parts", None), list):
        return "drop 'dapo_dynamic_sampling' from parts (and set dynamic_sampling=False)"
    return "set dynamic_sampling=False"


@register_part
class DynamicSampling(Part):
    """DAPO's dynamic sampling (this module's docstring). Usable with every GRPO-family trainer here (field
    ``dynamic_sampling`` of its config) and with plain GRPO (``ComposedConfig(parts=["dapo_dynamic_sampling"])``)."""

    name = "dapo_dynamic_sampling"
    citation, tag = DAPO, "dapo"  # model cards
    fills_batch = True

    def __init__(self, max_rounds: int, seed: int):
        self.max_rounds = max_rounds
        self.stream = RefillStream(seed)
        self._warned = False

    @classmethod
    def from_config(cls, args) -> DynamicSampling:
        """The part as a config's ``dynamic_sampling_*`` fields and ``seed`` set it up."""
        return cls(args.dynamic_sampling_max_rounds, args.seed)

    def check(self, trainer_name, args, train_dataset, kwargs) -> None:
        columns = getattr(train_dataset, "column_names", None) or []
        if {"image", "images"} & set(columns):
            raise ValueError(f"{trainer_name}: dynamic_sampling moves text rows between generation rounds; image "
                             f"datasets are not supported with it: {_turn_off(args)}")

    # ------------------------------------------------------------------------------------------- the box ---
    def fill(self, trainer, inputs, rollout):
        """``(inputs, output)`` of a generation batch holding only groups with a signal (as far as the bound
        allows); ``rollout(inputs)`` samples and scores one round as GRPO does."""
        acc, G = trainer.accelerator, trainer.num_generations
        n_local = len(inputs)
        places = n_local * acc.num_processes // G  # groups in the global generation batch
        rounds, kept = [], 0
        while True:
            output = rollout(inputs)  # 1. one round, scored as GRPO scores it
            rewards = trainer._rollout_rewards  # every process's rows, in process order
            weights = trainer.reward_weights.to(rewards.device)
            signal = groups_with_signal(rewards, weights, G, trainer.multi_objective_aggregation).cpu()  # 2.
            rounds.append((inputs, output, signal, weighted_rewards(rewards, weights).view(-1, G).cpu()))
            kept += int(signal.sum())
            if kept >= places or len(rounds) >= self.max_rounds:
                break
            inputs = self._refill(trainer, n_local, G)  # 3. the next prompts
        chosen, fillers = self._choose(rounds, places)  # 4.
        self._log(trainer, rounds, len(fillers))
        if not fillers and chosen == [(0, g) for g in range(places)]:  # every group of round 1: GRPO's batch
            return rounds[0][0], rounds[0][1]
        return self._assemble(trainer, rounds, chosen, fillers, n_local, G)

    def _refill(self, trainer, n_local: int, G: int) -> list[dict]:
        """This process's rows of the next global batch of refill prompts (each prompt G times, whole groups laid
        out over the processes as GRPO's sampler lays them)."""
        acc = trainer.accelerator
        prompts = self.stream.rows(trainer.train_dataset, n_local * acc.num_processes // G)
        rows = [dict(row) for row in prompts for _ in range(G)]
        return rows[acc.process_index * n_local: (acc.process_index + 1) * n_local]

    @staticmethod
    def _choose(rounds, places: int) -> tuple[list[tuple[int, int]], set[tuple[int, int]]]:
        """(round, group) of the batch's groups in sampling order: the first kept ones and, if the bound cut the
        search short, the first dropped ones (returned apart too: they are masked out of the loss)."""
        kept = [(r, g) for r, (_, _, signal, _) in enumerate(rounds) for g in range(len(signal)) if signal[g]]
        dropped = [(r, g) for r, (_, _, signal, _) in enumerate(rounds) for g in range(len(signal)) if not signal[g]]
        fillers = set(dropped[: places - len(kept[:places])])
        return sorted(kept[:places] + list(fillers)), fillers

    def _log(self, trainer, rounds, unfilled: int) -> None:
        sampled = sum(len(signal) for _, _, signal, _ in rounds)
        kept = sum(int(signal.sum()) for _, _, signal, _ in rounds)
        all_correct = 0
        for _, _, signal, rewards in rounds:  # a dropped group is all correct or all wrong (NaN: no reward)
            scored = ~rewards.isnan()
            correct = ((rewards >= CORRECT_AT) | ~scored).all(dim=1) & scored.any(dim=1)
            all_correct += int(correct[~signal].sum())
        metrics = trainer._metrics["train"]
        metrics["dynamic_sampling/rounds"].append(float(len(rounds)))
        metrics["dynamic_sampling/kept_fraction"].append(kept / sampled)
        metrics["dynamic_sampling/dropped_all_correct"].append(float(all_correct))
        metrics["dynamic_sampling/dropped_all_wrong"].append(float(sampled - kept - all_correct))
        metrics["dynamic_sampling/unfilled_groups"].append(float(unfilled))
        if unfilled and not self._warned and trainer.accelerator.is_main_process:
            self._warned = True
            logger.warning(
                "dynamic sampling: %d of the batch's groups have no learning signal after %d generation rounds "
                "(dynamic_sampling_max_rounds); the step trains on the others (their completions are masked out). "
                "The metric dynamic_sampling/unfilled_groups counts them at every step; raise the bound or use "
                "harder/easier prompts. Said once.", unfilled, len(rounds))

    # ---------------------------------------------------------------------- moving rows to their process ---
    def _assemble(self, trainer, rounds, chosen, fillers, n_local: int, G: int):
        """The chosen groups' rows as one batch: process p trains global rows [p * n_local, (p + 1) * n_local)."""
        acc = trainer.accelerator
        rank, lo = acc.process_index, acc.process_index * n_local
        mine = []  # (destination row, input row, {key: row tensor}) for the chosen rows this process holds
        for dest_group, (r, g) in enumerate(chosen):
            inputs, output, _, _ = rounds[r]
            for k in range(G):
                row = g * G + k
                if row // n_local == rank:
                    i = row % n_local
                    tensors = {key: t[i].cpu() for key, t in output.items() if key != "num_items_in_batch"}
                    mine.append((dest_group * G + k, inputs[i], tensors, (r, g) in fillers))
        rows = sorted((x for x in gather_object(mine) if lo <= x[0] < lo + n_local), key=lambda x: x[0])
        kinds = _kinds(trainer, rounds[0][1])
        output = {key: _stack([x[2][key] for x in rows], kind, _pad_value(trainer, key))
                  for key, kind in kinds.items()}
        masked = torch.tensor([x[3] for x in rows])  # unfilled places: out of the loss
        output["completion_mask"][masked] = 0
        output = _trim(output, kinds, trainer.pad_to_multiple_of)
        output = {key: t.to(acc.device) for key, t in output.items()}
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        output["num_items_in_batch"] = acc.gather(loss_mask.sum()).sum()
        return [x[1] for x in rows], output

    # ---------------------------------------------------------------------------------------- checkpoint ---
    def state(self) -> dict:
        return {"dapo_refill_epoch": self.stream.epoch, "dapo_refill_pos": self.stream.pos}

    def load_state(self, state: dict) -> None:
        self.stream.epoch, self.stream.pos = state["dapo_refill_epoch"], state["dapo_refill_pos"]


def with_dynamic_sampling(parts: list[Part], args) -> list[Part]:
    """``parts`` plus :class:`DynamicSampling` when the config turns it on (``dynamic_sampling``, the field every
    GRPO-family config here inherits from :class:`~trl_variants.dapo.config.DynamicSamplingConfig`) and no part
    already decides what fills the batch: what ERPO's, DPH-RL's and EEPO's trainers run (their ``make_parts``)."""
    parts = list(parts)
    if getattr(args, "dynamic_sampling", False) and not any(p.fills_batch for p in parts):
        parts.append(DynamicSampling.from_config(args))
    return parts


def _kinds(trainer, output) -> dict[str, str]:
    """How each per-row entry of GRPO's batch is laid out: ``prompt`` (left-padded), ``completion`` (right-padded
    along the completion) or ``row`` (one value per row)."""
    width = output["completion_ids"].size(1)
    sequence_ratio = str(trainer.vllm_importance_sampling_mode).startswith("sequence")
    kinds = {}
    for key, t in output.items():
        if key == "num_items_in_batch":
            continue
        if not torch.is_tensor(t):
            raise ValueError(f"dynamic sampling cannot move the batch entry {key!r} between rounds (not a per-row "
                             f"tensor): {_turn_off(trainer.args)}")
        if key in PROMPT_KEYS:
            kinds[key] = "prompt"
        elif t.dim() >= 2 and t.size(1) == width and not (key == "importance_sampling_ratio" and sequence_ratio):
            kinds[key] = "completion"
        else:
            kinds[key] = "row"
    return kinds


def _pad_value(trainer, key: str):
    if key in ("prompt_ids", "completion_ids"):
        return trainer._tokenizer.pad_token_id
    return 1 if key == "tool_mask" else 0  # TRL pads tool masks with 1 (the completion mask decides)


def _stack(rows: list[torch.Tensor], kind: str, pad_value) -> torch.Tensor:
    if kind == "row":
        return torch.stack(rows)
    width = max(r.size(0) for r in rows)
    out = rows[0].new_full((len(rows), width, *rows[0].shape[1:]), pad_value)
    for i, r in enumerate(rows):
        if kind == "prompt":
            out[i, width - r.size(0):] = r
        else:
            out[i, : r.size(0)] = r
    return out


def _trim(output: dict, kinds: dict, multiple: int | None) -> dict:
    """Drop the padding columns no row uses (rows from different rounds were padded to different widths), keeping
    widths at multiples of ``pad_to_multiple_of`` as GRPO does."""
    def width(used: int) -> int:
        used = max(used, 1)
        return used if not multiple else -(-used // multiple) * multiple

    prompt_cols = output["prompt_mask"].any(dim=0).nonzero()
    p = width(output["prompt_mask"].size(1) - int(prompt_cols.min()) if len(prompt_cols) else 0)
    completion_cols = output["completion_mask"].any(dim=0).nonzero()
    c = width(int(completion_cols.max()) + 1 if len(completion_cols) else 0)
    p, c = min(p, output["prompt_mask"].size(1)), min(c, output["completion_mask"].size(1))
    return {key: (t[:, t.size(1) - p:] if kinds[key] == "prompt" else t[:, :c] if kinds[key] == "completion" else t)
            for key, t in output.items()}
