"""The offline reference pass (stage 1) shared by ERPO, DPH-RL and A*-PO.

One pass of the frozen reference policy over the training prompts, run once before RL starts:

* ERPO needs ``l_ref(s)``, the reference log-likelihood of every prompt (one forward pass, no sampling);
* A*-PO needs N sampled completions per prompt, their rewards and ``V_hat(x)`` (:func:`losses.optimal_value`);
* DPH-RL needs k sampled completions per prompt, their rewards, and for the correct ones the per-token reference
  log-probs (then :func:`dph_split` separates near-perfect prompts from the exploration set).

:func:`presample` returns the input dataset with new columns (see :data:`COLUMNS`). Prompts are tokenized exactly as
``GRPOTrainer`` tokenizes them. Results are cached on disk in shards keyed by the model, the dataset fingerprint and
every option that changes them: a second call loads instead of regenerating, an interrupted call resumes from its
finished shards, and each shard is seeded by its index so the result does not depend on interruptions or on the
number of processes.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .generation import generate_completions, tokenize_prompts

logger = logging.getLogger(__name__)

REF_PROMPT_LOGP = "ref_prompt_logp"
COLUMNS = {
    "ref_prompt_ids": "prompt token ids exactly as GRPOTrainer feeds them (list[int])",
    "ref_completion_ids": "N sampled completions, token ids cut after the first EOS (list[list[int]])",
    "ref_completions": "the same completions as text (list[str])",
    "ref_rewards": "reward of each completion, weighted sum over the reward functions (list[float])",
    "ref_completion_logps": "per-token reference log-probs of each completion, at the sampling temperature "
    "(list[list[float]]; only with record_completion_logps)",
    "ref_prompt_logp": "l_ref(s): sum of the prompt's token log-probs, first token skipped (float; record_prompt_logp)",
    "ref_value": "V_hat(x) = beta * log mean exp(r / beta) over the N rewards (float; only with value_beta)",
}
"""Columns :func:`presample` adds, and what they hold."""

METADATA_KEY = "trl_variants_presample"


@dataclass
class PresampleConfig:
    """Options of the offline reference pass. Every field that changes the result is part of the cache key.

    Parameters:
        num_samples: completions per prompt (A*-PO's N, DPH-RL's k); 0 records only prompt log-likelihoods (ERPO).
        greedy: decode greedily instead of sampling (needs num_samples 1; used by evaluation).
        temperature, top_p, top_k: sampling parameters (top_k 0 = off). Log-probs are of the temperature-scaled
            distribution, as GRPOTrainer computes them.
        max_prompt_length: keep the last this many prompt tokens (left truncation); None = no truncation.
        max_completion_length: maximum new tokens per completion.
        record_prompt_logp: add ``ref_prompt_logp`` (ERPO's l_ref).
        record_completion_logps: add per-token ``ref_completion_logps`` (DPH-RL).
        value_beta: add ``ref_value`` with this beta1 (A*-PO; paper 0.5); None = skip.
        seed: base seed; shard ``i`` samples with seed ``seed * 1_000_003 + i``.
        generation_batch_size: sequences (prompt x sample) per ``generate`` call.
        logprob_batch_size: sequences per scoring forward pass.
        shard_size: prompts per cache shard (the unit of resume and of work sharing between processes).
        backend: ``"hf"`` (transformers generate), ``"vllm"`` (needs vllm and a GPU) or ``"auto"`` (vLLM when
            available, else hf).
        cache_dir: where shards and the final dataset are stored; None = ``$TRL_VARIANTS_CACHE`` or
            ``~/.cache/trl_variants/presample``. ``use_cache=False`` recomputes and stores nothing.
    """

    num_samples: int = 8
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_prompt_length: int | None = None
    max_completion_length: int = 256
    record_prompt_logp: bool = True
    record_completion_logps: bool = False
    value_beta: float | None = None
    seed: int = 0
    generation_batch_size: int = 64
    logprob_batch_size: int = 8
    shard_size: int = 64
    backend: str = "hf"
    cache_dir: str | None = None
    use_cache: bool = True
    show_progress: bool = True

    # fields that do not change the result (excluded from the cache key)
    _NOT_IN_KEY = ("generation_batch_size", "logprob_batch_size", "backend", "cache_dir", "use_cache",
                   "show_progress")

    def __post_init__(self):
        if self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0 (0: prompt log-likelihoods only), got {self.num_samples}")
        if self.value_beta is not None and not self.value_beta > 0:
            raise ValueError(f"value_beta (A*-PO's beta1) must be > 0, got {self.value_beta}")
        if self.value_beta is not None and self.num_samples < 1:
            raise ValueError("value_beta needs num_samples >= 1 (V_hat is computed from sampled rewards)")
        if self.greedy and self.num_samples != 1:
            raise ValueError(f"greedy decoding gives one completion per prompt: num_samples must be 1, got "
                             f"{self.num_samples}")
        if self.record_completion_logps and self.num_samples < 1:
            raise ValueError("record_completion_logps needs num_samples >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("max_completion_length", "generation_batch_size", "logprob_batch_size", "shard_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in ("hf", "vllm", "auto"):
            raise ValueError(f"backend must be 'hf', 'vllm' or 'auto', got {self.backend!r}")

    def key_options(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in self._NOT_IN_KEY}


# --------------------------------------------------------------------------------------------- scoring ---
def _left_pad(rows: Sequence[Sequence[int]], pad_id: int):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = torch.tensor(list(r))
            mask[i, width - len(r) :] = 1
    return ids, mask


@torch.no_grad()
def token_logps(model, input_ids, attention_mask, temperature: float = 1.0, batch_size: int = 8,
                with_entropy: bool = False):
    """``log softmax(logits / temperature)`` of each next token: a ``(B, L - 1)`` tensor whose column ``t`` scores
    token ``t + 1``. Zero where the token or its predecessor is padding (so the first real token, which has no
    prediction, is skipped). Uses the model's plain forward; rows are processed ``batch_size`` at a time.
    With ``with_entropy`` also returns the entropy of each predictive distribution (same shape)."""
    device = next(model.parameters()).device
    out, entropies = [], []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size].to(device)
            mask = attention_mask[start : start + batch_size].to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float() / temperature
            all_logps = torch.log_softmax(logits, dim=-1)
            logps = all_logps.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
            valid = (mask[:, 1:] * mask[:, :-1]).bool()
            out.append(logps.masked_fill(~valid, 0.0).cpu())
            if with_entropy:
                ent = -(all_logps.exp() * all_logps).sum(-1)
                entropies.append(ent.masked_fill(~valid, 0.0).cpu())
    finally:
        model.train(was_training)
    return (torch.cat(out), torch.cat(entropies)) if with_entropy else torch.cat(out)


def prompt_logps_from_ids(
    model, prompt_ids, pad_token_id: int, temperature: float = 1.0, batch_size: int = 8, token_logps_fn=None
) -> torch.Tensor:
    """``l(s)`` for each tokenized prompt: the sum of its token log-probs, first token skipped (1-D float tensor).

    ``token_logps_fn(input_ids, attention_mask) -> (B, L - 1)`` replaces :func:`token_logps` (a trainer passes its
    own fused, temperature-scaled scorer so that ``l_ref`` and its ``l_theta`` come from the same kernel)."""
    out = []
    for start in range(0, len(prompt_ids), batch_size):
        ids, mask = _left_pad(prompt_ids[start : start + batch_size], pad_token_id)
        if token_logps_fn is None:
            logps = token_logps(model, ids, mask, temperature, batch_size)
        else:
            logps = token_logps_fn(ids, mask).float().cpu()
        out.append((logps * (mask[:, 1:] * mask[:, :-1])).sum(-1))
    return torch.cat(out)


def completion_token_logps(
    model, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]], temperature: float = 1.0,
    batch_size: int = 8, pad_token_id: int = 0, token_logps_fn=None,
) -> list[list[float]]:
    """Per-token log-probs of each completion given the prompt (one list per completion, same length)."""
    if not completions:
        return []
    rows = [list(prompt_ids) + list(c) for c in completions]
    ids, mask = _left_pad(rows, pad_token_id)
    if token_logps_fn is None:
        logps = token_logps(model, ids, mask, temperature, batch_size)
    else:
        logps = token_logps_fn(ids, mask).float().cpu()
    out = []
    for i, c in enumerate(completions):
        n = len(c)
        out.append(logps[i, logps.size(1) - n :].tolist() if n else [])
    return out


def reference_prompt_logps(
    model, tokenizer, prompts: Sequence, *, temperature: float = 1.0, batch_size: int = 8, max_prompt_length=None,
    token_logps_fn=None,
) -> list[float]:
    """ERPO's ``l_ref(s)`` for every prompt (plain or conversational), tokenized as GRPOTrainer tokenizes them."""
    ids = tokenize_prompts(tokenizer, prompts, max_prompt_length)
    _check_prompt_lengths(ids)
    return prompt_logps_from_ids(model, ids, tokenizer.pad_token_id, temperature, batch_size, token_logps_fn).tolist()


def _check_prompt_lengths(ids):
    short = [i for i, x in enumerate(ids) if len(x) < 2]
    if short:
        raise ValueError(f"prompts at rows {short[:5]} have fewer than 2 tokens: their log-likelihood is undefined")


def add_reference_prompt_logps(
    dataset, model, tokenizer, *, column: str = REF_PROMPT_LOGP, temperature: float = 1.0, batch_size: int = 8,
    accelerator=None, token_logps_fn=None, desc: str = "reference prompt log-likelihoods",
):
    """Return ``dataset`` with ``column`` = ``l_ref(s)`` of every row's ``prompt`` (ERPO's pre-computed Query-KL
    term). Under an ``accelerator`` with several processes each computes a contiguous shard and the results are
    gathered in the original order."""
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    _check_prompt_column(dataset)
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    per = -(-len(dataset) // world)
    mine = list(range(rank * per, min(len(dataset), (rank + 1) * per)))
    values: list[float] = []
    bar = tqdm(total=len(mine), desc=desc, disable=rank != 0, unit="prompt")
    chunk = max(batch_size, 256)
    for start in range(0, len(mine), chunk):
        idx = mine[start : start + chunk]
        values += reference_prompt_logps(
            model, tokenizer, dataset.select(idx)["prompt"], temperature=temperature, batch_size=batch_size,
            token_logps_fn=token_logps_fn,
        )
        bar.update(len(idx))
    bar.close()
    if world > 1:
        values = gather_object(values)
    if column in dataset.column_names:
        dataset = dataset.remove_columns(column)
    return dataset.add_column(column, values)


# ------------------------------------------------------------------------------------------- rewards ---
_TRL_REWARD_KWARGS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                      "environments", "kwargs"}


def _reward_name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


def check_reward_columns(reward_funcs: Sequence[Callable], column_names: Sequence[str]) -> None:
    """Raise (naming the function and the column) when a reward function has a required parameter that is neither
    part of TRL's reward signature nor a dataset column."""
    for func in reward_funcs:
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.default is not p.empty:
                continue
            if p.name not in _TRL_REWARD_KWARGS and p.name not in column_names:
                raise ValueError(
                    f"reward function {_reward_name(func)!r} needs the dataset column {p.name!r}, which the dataset "
                    f"does not have (columns: {list(column_names)}): add it or rename a column to {p.name!r}"
                )


def score_completions(reward_funcs, reward_weights, prompts, completions, completion_ids, columns) -> list[float]:
    """Weighted sum of the reward functions, called with GRPOTrainer's reward signature (``prompts``,
    ``completions``, ``completion_ids``, every dataset column as a keyword list, ``trainer_state=None``, and no-op
    ``log_extra`` / ``log_metric``). ``None`` rewards count as 0."""
    total = [0.0] * len(completions)
    for func, weight in zip(reward_funcs, reward_weights, strict=True):
        values = func(prompts=prompts, completions=completions, completion_ids=completion_ids, trainer_state=None,
                      log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None, **columns)
        if len(values) != len(completions):
            raise ValueError(f"reward function {_reward_name(func)!r} returned {len(values)} values for "
                             f"{len(completions)} completions")
        total = [t + weight * (0.0 if v is None else float(v)) for t, v in zip(total, values, strict=True)]
    return total


# ---------------------------------------------------------------------------------------- the pass ---
def _check_prompt_column(dataset):
    if "prompt" not in dataset.column_names:
        raise ValueError(f"the dataset has no 'prompt' column (columns: {dataset.column_names}); rename your prompt "
                         "column to 'prompt'")


def _model_fingerprint(model) -> str:
    """Identity of the model's weights: name, and a hash of a sample of every parameter tensor."""
    h = hashlib.sha256(str(getattr(model.config, "_name_or_path", "")).encode())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)][:64].float().cpu()
            h.update(name.encode())
            h.update(sample.numpy().tobytes())
            h.update(str(float(p.detach().float().sum())).encode())
    return h.hexdigest()[:16]


def _tokenizer_fingerprint(tokenizer) -> str:
    probe = "\n".join(["What is 4 + 7?", "<|im_start|>", "\\boxed{1}", "  x"])
    h = hashlib.sha256(json.dumps([tokenizer(probe)["input_ids"], str(getattr(tokenizer, "chat_template", "")),
                                   tokenizer.pad_token_id, tokenizer.eos_token_id]).encode())
    return h.hexdigest()[:16]


def cache_key(model, tokenizer, dataset, config: PresampleConfig, reward_funcs=(), reward_weights=()) -> str:
    """Key of a pass: model weights, tokenizer, dataset fingerprint, reward functions and result options."""
    payload = {
        "model": _model_fingerprint(model),
        "tokenizer": _tokenizer_fingerprint(tokenizer),
        "dataset": getattr(dataset, "_fingerprint", None) or hashlib.sha256(
            json.dumps(dataset.to_dict(), default=str).encode()).hexdigest(),
        "rows": len(dataset),
        "rewards": [f"{getattr(f, '__module__', '')}.{_reward_name(f)}" for f in reward_funcs],
        "reward_weights": list(map(float, reward_weights)),
        "options": config.key_options(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRL_VARIANTS_CACHE", Path.home() / ".cache" / "trl_variants" / "presample"))


def _atomic_write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one, never half of it
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_shard(path: Path, expected_rows: int):
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and len(data.get("rows", [])) == expected_rows else None


def _generate_vllm(llm, prompt_ids, config: PresampleConfig, shard_seed: int, eos_ids):  # pragma: no cover - GPU
    from vllm import SamplingParams

    from .generation import truncate_after_eos

    temperature = 0.0 if config.greedy else config.temperature  # vLLM decodes greedily at temperature 0
    params = SamplingParams(n=config.num_samples, temperature=temperature, top_p=config.top_p,
                            top_k=config.top_k if config.top_k > 0 else -1, max_tokens=config.max_completion_length,
                            seed=shard_seed)
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], params, use_tqdm=False)
    return [[truncate_after_eos(list(o.token_ids), eos_ids) for o in out.outputs] for out in outs]


def _resolve_backend(config: PresampleConfig) -> str:
    if config.backend == "hf":
        return "hf"
    from transformers.utils import is_torch_cuda_available

    try:
        import vllm  # noqa: F401

        have_vllm = True
    except ImportError:
        have_vllm = False
    if config.backend == "vllm" and not (have_vllm and is_torch_cuda_available()):
        raise RuntimeError("backend='vllm' needs the vllm package and a CUDA GPU: pip install 'trl-variants[vllm]', "
                           "or use backend='hf'")
    return "vllm" if have_vllm and is_torch_cuda_available() else "hf"


def _process_shard(rows, shard_index, model, tokenizer, config, reward_funcs, reward_weights, vllm_llm,
                   token_logps_fn=None):
    """Compute the new columns for one shard of dataset rows (a list of dicts)."""
    from .generation import eos_token_ids

    prompts = [r["prompt"] for r in rows]
    prompt_ids = tokenize_prompts(tokenizer, prompts, config.max_prompt_length)
    out = [{"ref_prompt_ids": ids} for ids in prompt_ids]
    if config.record_prompt_logp:
        _check_prompt_lengths(prompt_ids)
        logps = prompt_logps_from_ids(model, prompt_ids, tokenizer.pad_token_id, config.temperature,
                                      config.logprob_batch_size, token_logps_fn)
        for o, v in zip(out, logps.tolist(), strict=True):
            o[REF_PROMPT_LOGP] = v
    if config.num_samples == 0:
        return out
    seed = config.seed * 1_000_003 + shard_index
    if vllm_llm is not None:
        samples = _generate_vllm(vllm_llm, prompt_ids, config, seed, eos_token_ids(tokenizer, model))
    else:
        torch.manual_seed(seed)
        samples = generate_completions(
            model, tokenizer, prompt_ids, config.num_samples, max_new_tokens=config.max_completion_length,
            temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
            batch_size=config.generation_batch_size, do_sample=not config.greedy,
        )
    conversational = isinstance(prompts[0], list)
    columns = {k: [r[k] for r in rows for _ in range(config.num_samples)] for k in rows[0] if k != "prompt"}
    flat_ids = [c for per_prompt in samples for c in per_prompt]
    texts = tokenizer.batch_decode(flat_ids, skip_special_tokens=True)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
    rewards = score_completions(reward_funcs, reward_weights, [p for p in prompts for _ in range(config.num_samples)],
                                completions, flat_ids, columns)
    n = config.num_samples
    for i, o in enumerate(out):
        o["ref_completion_ids"] = samples[i]
        o["ref_completions"] = texts[i * n : (i + 1) * n]
        o["ref_rewards"] = rewards[i * n : (i + 1) * n]
        if config.value_beta is not None:
            from .losses import optimal_value

            o["ref_value"] = float(optimal_value(torch.tensor(o["ref_rewards"], dtype=torch.float64),
                                                 config.value_beta))
        if config.record_completion_logps:
            o["ref_completion_logps"] = completion_token_logps(
                model, prompt_ids[i], samples[i], config.temperature, config.logprob_batch_size,
                tokenizer.pad_token_id, token_logps_fn)
    return out


def presample(
    model,
    tokenizer,
    dataset,
    reward_funcs: Callable | Sequence[Callable] = (),
    config: PresampleConfig | None = None,
    *,
    reward_weights: Sequence[float] | None = None,
    accelerator=None,
    token_logps_fn=None,
):
    """Run the offline reference pass and return ``dataset`` with the :data:`COLUMNS` it records.

    Args:
        model: the frozen reference policy: a model object, or a path / Hub id loaded with ``AutoModelForCausalLM``.
        tokenizer: its tokenizer (None: loaded from ``model`` when that is a path).
        dataset: a ``datasets.Dataset`` with a ``prompt`` column (plain or conversational) plus the columns the
            reward functions read.
        reward_funcs: TRL-signature reward callables (required when ``config.num_samples > 0``).
        config: :class:`PresampleConfig`.
        reward_weights: one weight per reward function (default all 1).
        accelerator: an ``accelerate.Accelerator`` (or ``PartialState``) to split the shards between processes;
            every process returns the full, ordered dataset.
        token_logps_fn: ``(input_ids, attention_mask) -> (B, L - 1)`` log-probs replacing the plain forward (a
            trainer passes its fused, temperature-scaled scorer so stored and online log-probs share a kernel).
    """
    from accelerate.utils import gather_object
    from tqdm.auto import tqdm

    config = config or PresampleConfig()
    reward_funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    reward_weights = [1.0] * len(reward_funcs) if reward_weights is None else list(reward_weights)
    # --- every check before any expensive work ---
    _check_prompt_column(dataset)
    if len(dataset) == 0:
        raise ValueError("the dataset is empty")
    if config.num_samples > 0 and not reward_funcs:
        raise ValueError("num_samples > 0 needs at least one reward function (reward_funcs=[...])")
    if len(reward_weights) != len(reward_funcs):
        raise ValueError(f"reward_weights has {len(reward_weights)} entries for {len(reward_funcs)} reward functions")
    check_reward_columns(reward_funcs, dataset.column_names)
    clash = [c for c in COLUMNS if c in dataset.column_names]
    if clash:
        raise ValueError(f"the dataset already has presample columns {clash}: it was presampled already (pass it "
                         "to the trainer as is), or remove those columns first")
    if isinstance(model, str | os.PathLike):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(model)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, padding_side="left", truncation_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
        if accelerator is not None:
            model = model.to(accelerator.device)
    if tokenizer is None:
        raise ValueError("tokenizer is required when model is a model object")

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    key = cache_key(model, tokenizer, dataset, config, reward_funcs, reward_weights)
    root = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
    run_dir = root / key
    final = run_dir / "dataset"
    if config.use_cache and (final / "state.json").exists():
        from datasets import load_from_disk

        logger.info("presample: cache hit %s", final)
        return load_from_disk(str(final))

    backend = _resolve_backend(config) if config.num_samples > 0 else "hf"
    vllm_llm = None
    if backend == "vllm":  # pragma: no cover - GPU only
        from vllm import LLM

        vllm_llm = LLM(model=model.config._name_or_path, seed=config.seed)
    n_shards = math.ceil(len(dataset) / config.shard_size)
    mine = list(range(rank, n_shards, world))  # round robin: every process gets shards from start to end
    results: list[tuple[int, list[dict]]] = []
    todo = []
    for s in mine:
        rows = min(config.shard_size, len(dataset) - s * config.shard_size)
        cached = _read_shard(run_dir / f"shard-{s:06d}.json", rows) if config.use_cache else None
        (results.append((s, cached["rows"])) if cached else todo.append(s))
    if config.use_cache:
        _atomic_write_json(run_dir / "options.json", {"key": key, "options": config.key_options(),
                                                       "rows": len(dataset), "shards": n_shards})

    bar = tqdm(total=sum(min(config.shard_size, len(dataset) - s * config.shard_size) for s in todo),
               desc="presample", unit="prompt", disable=rank != 0 or not config.show_progress)
    start_t, n_samples = time.perf_counter(), 0
    for s in todo:
        rows = dataset.select(range(s * config.shard_size, min(len(dataset), (s + 1) * config.shard_size)))
        with torch.no_grad():
            out = _process_shard(list(rows), s, model, tokenizer, config, reward_funcs, reward_weights, vllm_llm,
                                 token_logps_fn)
        if config.use_cache:
            _atomic_write_json(run_dir / f"shard-{s:06d}.json", {"shard": s, "rows": out})
        results.append((s, out))
        n_samples += len(out) * max(1, config.num_samples)
        bar.update(len(out))
        bar.set_postfix(samples_per_s=f"{n_samples / max(1e-9, time.perf_counter() - start_t):.1f}")
    bar.close()

    if world > 1:
        results = gather_object(results)
    results.sort(key=lambda r: r[0])
    new_rows = [row for _, rows in results for row in rows]
    if len(new_rows) != len(dataset) or [s for s, _ in results] != list(range(n_shards)):
        raise RuntimeError(f"presample merged {len(new_rows)} rows from shards {[s for s, _ in results]} for a "
                           f"dataset of {len(dataset)} rows: shards are missing or duplicated")
    out_ds = dataset
    for col in new_rows[0]:
        out_ds = out_ds.add_column(col, [r[col] for r in new_rows])
    out_ds = _with_metadata(out_ds, config, key)
    summary = summarize(out_ds)
    if rank == 0 and config.show_progress and summary:
        print("presample summary: " + ", ".join(f"{k} {v:.4g}" for k, v in summary.items()))
    if config.use_cache and rank == 0:
        tmp = run_dir / f".dataset-tmp-{os.getpid()}"
        out_ds.save_to_disk(str(tmp))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    if world > 1 and accelerator is not None:
        accelerator.wait_for_everyone()
    return out_ds


def _with_metadata(dataset, config: PresampleConfig, key: str):
    info = dataset.info
    info.description = json.dumps({METADATA_KEY: {"options": config.key_options(), "cache_key": key}})
    return dataset


def presample_options(dataset) -> dict | None:
    """The :class:`PresampleConfig` options a presampled dataset was made with (None for other datasets)."""
    try:
        return json.loads(dataset.info.description or "")[METADATA_KEY]["options"]
    except (ValueError, KeyError, TypeError):
        return None


def check_presample_options(dataset, **expected) -> None:
    """Raise when a presampled dataset was made with options other than ``expected`` (e.g. a trainer's N, beta1 or
    temperature), naming the option, both values and the fix."""
    options = presample_options(dataset)
    if options is None:
        return
    for name, want in expected.items():
        have = options.get(name)
        if want is not None and have != want:
            raise ValueError(f"the presampled dataset was made with {name}={have!r} but the trainer is configured "
                             f"with {want!r}: set the trainer's value to {have!r} or presample again with {want!r}")


def dataset_card(dataset, model_id: str, dataset_id: str | None = None) -> str:
    """A Hub dataset card (README.md) for a presampled dataset: what the columns are, the options, the summary, and
    the citations of the methods that consume it."""
    from ._citations import APO, DPH, ERPO

    options = presample_options(dataset) or {}
    summary = summarize(dataset)
    cols = [f"- `{c}`: {COLUMNS[c]}" for c in dataset.column_names if c in COLUMNS]
    opts = "\n".join(f"| `{k}` | `{v}` |" for k, v in sorted(options.items()))
    stats = ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
    return f"""---
tags:
- trl
- trl-variants
- presample
---

# Offline reference pass{f" ({dataset_id})" if dataset_id else ""}

Made by `trl-variants presample` from the reference policy `{model_id}` over {len(dataset)} prompts: stage 1 of
A*-PO (N samples, V_hat), DPH-RL (k samples, reward split, per-token reference log-probs) and ERPO's reference
prompt log-likelihoods. Pass it to `APOTrainer`, `DPHTrainer` or `ERPOTrainer` as `train_dataset` and no sampling
runs before training.

## Columns
{chr(10).join(cols)}

## Options
| option | value |
|---|---|
{opts}

## Summary
{stats or "prompt log-likelihoods only"}

## Citations
```bibtex
{APO}

{DPH}

{ERPO}
```
"""


def summarize(dataset) -> dict[str, float]:
    """Mean reward, fraction of prompts whose samples are all correct / all wrong, and (if present) mean V_hat."""
    if "ref_rewards" not in dataset.column_names:
        return {}
    rewards = dataset["ref_rewards"]
    flat = [r for rs in rewards for r in rs]
    out = {
        "mean_reward": sum(flat) / len(flat),
        "frac_all_correct": sum(all(r > 0 for r in rs) for rs in rewards) / len(rewards),
        "frac_all_wrong": sum(all(r <= 0 for r in rs) for rs in rewards) / len(rewards),
    }
    if "ref_value" in dataset.column_names:
        out["mean_value"] = sum(dataset["ref_value"]) / len(dataset)
    return out


# ------------------------------------------------------------------------------------------ DPH-RL split ---
@dataclass
class DPHSplit:
    """Result of :func:`dph_split`: the near-perfect rehearsal rows and the exploration prompts."""

    pef: object  # datasets.Dataset: prompt_ids, completion_ids, completion_logps (one row per kept completion)
    exp: object  # datasets.Dataset: the exploration prompts (original columns)
    stats: dict = field(default_factory=dict)


def dph_split(dataset, threshold: int, keep: str = "all", refine_rewards: Sequence[float] | None = None) -> DPHSplit:
    """DPH-RL Sec. 4.1: prompts with at least ``threshold`` correct samples (of k) form D_pef, the rest D_exp.

    Args:
        dataset: a presampled dataset with ``ref_rewards``, ``ref_completion_ids``, ``ref_completion_logps``.
        threshold: the "t of k" rule (paper recommends k of k).
        keep: ``"all"`` correct completions of a D_pef prompt become rehearsal rows, or ``"one"`` (the first).
        refine_rewards: optional, one extra sample's reward per prompt (the refinement draw): a D_pef prompt whose
            extra sample is wrong moves to D_exp.
    Returns:
        :class:`DPHSplit` with ``pef`` rows (``prompt_ids``, ``completion_ids``, ``completion_logps``, ``prompt_index``)
        and ``exp`` = the D_exp rows of ``dataset`` without the presample columns.
    """
    from datasets import Dataset

    missing = [c for c in ("ref_rewards", "ref_completion_ids", "ref_completion_logps", "ref_prompt_ids")
               if c not in dataset.column_names]
    if missing:
        raise ValueError(f"dph_split needs a presampled dataset with {missing} (presample with "
                         "record_completion_logps=True)")
    if keep not in ("all", "one"):
        raise ValueError(f"keep must be 'all' or 'one', got {keep!r}")
    k = len(dataset[0]["ref_rewards"])
    if not 1 <= threshold <= k:
        raise ValueError(f"threshold must be between 1 and k={k} (samples per prompt), got {threshold}")
    if refine_rewards is not None and len(refine_rewards) != len(dataset):
        raise ValueError(f"refine_rewards has {len(refine_rewards)} values for {len(dataset)} prompts")
    pef_rows = {"prompt_index": [], "prompt_ids": [], "completion_ids": [], "completion_logps": []}
    exp_index, moved = [], 0
    for i, (rewards, comps, logps, p_ids) in enumerate(zip(
            dataset["ref_rewards"], dataset["ref_completion_ids"], dataset["ref_completion_logps"],
            dataset["ref_prompt_ids"], strict=True)):
        correct = [j for j, r in enumerate(rewards) if r > 0]
        near_perfect = len(correct) >= threshold
        if near_perfect and refine_rewards is not None and not refine_rewards[i] > 0:
            near_perfect, moved = False, moved + 1
        if not near_perfect:
            exp_index.append(i)
            continue
        for j in correct[:1] if keep == "one" else correct:
            pef_rows["prompt_index"].append(i)
            pef_rows["prompt_ids"].append(p_ids)
            pef_rows["completion_ids"].append(comps[j])
            pef_rows["completion_logps"].append(logps[j])
    extra = [c for c in COLUMNS if c in dataset.column_names]
    exp = dataset.select(exp_index).remove_columns(extra)
    stats = {"num_prompts": len(dataset), "num_pef_prompts": len(dataset) - len(exp_index),
             "num_pef_rows": len(pef_rows["prompt_index"]), "num_exp_prompts": len(exp_index),
             "moved_by_refinement": moved}
    return DPHSplit(pef=Dataset.from_dict(pef_rows), exp=exp, stats=stats)
