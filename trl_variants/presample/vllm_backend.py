"""vLLM as the offline pass's generator: the option mapping, per-request seeds, and the three engines.

The pass (:func:`~trl_variants.presample.runner.presample`) is the same code whatever generates; only "sample these
prompt ids with these options" differs. A generator has

* ``name``: what generates, part of the cache key (``"hf"``, ``"vllm==<version>"``, ``"vllm-server:<model>"``);
* ``prepare()``: called on every process after the cache check and before any shard is generated (weight syncs are
  collectives, so every process calls it at the same point);
* ``generate(prompt_ids, rows, config, shard_seed) -> list[list[list[int]]]``: ``config.num_samples`` completions
  per prompt (token ids, cut after the first EOS, EOS kept); ``rows`` are the prompts' row indices in the dataset;
* ``finish()``: called when the pass ends (also on errors).

Engines: :class:`VLLMGenerator` wraps anything with ``vllm.LLM.generate``'s signature (an offline ``vllm.LLM`` built
by :func:`offline_generator`, or a trainer's colocated engine, :func:`trainer_generator`); :class:`ServerGenerator`
sends requests through TRL's ``VLLMClient`` (a trainer with ``vllm_mode="server"``).

Seeding: each prompt is one request with ``SamplingParams(n=N, seed=s)``, ``s = (seed * 1_000_003 + row) * N``; vLLM
seeds the i-th of the N samples with ``s + i`` (``vllm/v1/engine/parallel_sampling.py``), so every sample has its own
seed, a function of (seed, row, i) only: not of shards, batches, processes or interruptions.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ..generation import eos_token_ids, truncate_after_eos

# SamplingParams' input fields (vLLM 0.22-0.31), used to check generation_kwargs when vllm is not importable (tests)
SAMPLING_PARAMS_FIELDS = frozenset((
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
    "detokenize", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "output_kind", "structured_outputs", "logit_bias", "allowed_token_ids", "extra_args", "bad_words",
))
OWNED_BY_THE_PASS = {
    "n": "the pass asks for num_samples completions per prompt",
    "seed": "the pass seeds every request from --seed, so samples depend only on (seed, row, sample index)",
}


def vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return vllm.__version__


def vllm_usable() -> bool:
    """vllm importable and a CUDA GPU present."""
    from transformers.utils import is_torch_cuda_available

    return vllm_version() is not None and is_torch_cuda_available()


def check_vllm_setup(config) -> None:
    """For ``--use_vllm`` / ``backend="vllm"``: vllm and a GPU are there and every option can be honoured; raised
    before any data or model loads."""
    if not vllm_usable():
        raise RuntimeError("backend='vllm' (--use_vllm) needs the vllm package and a CUDA GPU: pip install "
                           "'trl-variants[vllm]' on a GPU machine, or use backend='hf'")
    check_vllm_options(config)


def sampling_params_fields() -> frozenset:
    try:
        from vllm import SamplingParams
    except ImportError:
        return SAMPLING_PARAMS_FIELDS
    fields = getattr(SamplingParams, "__struct_fields__", None)  # a msgspec Struct
    return frozenset(f for f in fields if not f.startswith("_")) if fields else SAMPLING_PARAMS_FIELDS


def sampling_kwargs(config, eos_ids) -> dict:
    """``SamplingParams`` arguments (without the seed) equivalent to ``config``'s sampling options, as TRL's vLLM
    path maps GRPOConfig's: ``top_k`` 0 and ``min_p`` 0 are off in both libraries (vLLM >= 0.8 takes 0 for "off",
    as TRL passes it), ``repetition_penalty`` is the same multiplicative penalty over prompt and completion tokens,
    greedy is temperature 0. ``max_prompt_length`` was applied to the prompt ids already. ``generation_kwargs`` are
    ``SamplingParams`` arguments here, as TRL passes them under ``use_vllm`` (they override the fields above); one
    that ``SamplingParams`` does not have (a transformers ``GenerationConfig`` option such as ``num_beams``,
    ``do_sample``, ``typical_p``) or that the pass owns (``n``, ``seed``) is refused by name. Generation stops at
    the same EOS ids as the transformers path (``stop_token_ids``)."""
    extra = dict(config.generation_kwargs or {})
    owned = sorted(k for k in extra if k in OWNED_BY_THE_PASS)
    if owned:
        raise ValueError("generation_kwargs " + "; ".join(f"{k!r}: {OWNED_BY_THE_PASS[k]}" for k in owned)
                         + ". Remove them from generation_kwargs")
    unknown = sorted(set(extra) - sampling_params_fields())
    if unknown:
        raise ValueError(f"generation_kwargs {unknown} are not vLLM SamplingParams options: with vLLM (use_vllm / "
                         "backend='vllm') generation_kwargs go to SamplingParams, as in TRL (transformers "
                         "GenerationConfig options such as num_beams, do_sample or typical_p have no vLLM "
                         "equivalent). Remove them, or use backend='hf'")
    greedy = config.greedy
    kwargs = dict(n=config.num_samples, temperature=0.0 if greedy else config.temperature, top_p=config.top_p,
                  top_k=config.top_k, min_p=config.min_p, repetition_penalty=config.repetition_penalty,
                  max_tokens=config.max_completion_length, stop_token_ids=list(eos_ids), logprobs=None)
    return {**kwargs, **extra}


def vllm_sampling_params(**kwargs):  # pragma: no cover - needs vllm
    from vllm import SamplingParams

    return SamplingParams(**kwargs)


def request_seed(seed: int, row: int, num_samples: int) -> int:
    """Seed of the request for dataset row ``row``; vLLM seeds its i-th sample with this + i (disjoint per row)."""
    return (seed * 1_000_003 + row) * max(1, num_samples)


def check_vllm_options(config) -> None:
    """Every option the vLLM path cannot honour, refused by name before any model loads."""
    sampling_kwargs(config, [])


class VLLMGenerator:
    """Generates with an object that has ``vllm.LLM.generate``'s signature (``generate(prompts, sampling_params,
    use_tqdm=...)`` returning ``RequestOutput``s with ``.outputs[i].token_ids``), one seeded request per prompt.

    ``sampling_params`` builds a request's parameters from keyword arguments (default ``vllm.SamplingParams``);
    ``on_prepare`` / ``on_finish`` run in :meth:`prepare` / :meth:`finish` (weight sync, sleep mode, freeing)."""

    def __init__(self, llm, eos_ids, *, name: str | None = None, sampling_params=None, on_prepare=None,
                 on_finish=None):
        self.llm, self.eos_ids = llm, list(eos_ids)
        self.name = name or f"vllm=={vllm_version()}"
        self._sampling_params, self._on_prepare, self._on_finish = sampling_params, on_prepare, on_finish

    def prepare(self):
        if self._on_prepare is not None:
            self._on_prepare()

    def finish(self):
        if self._on_finish is not None:
            self._on_finish()

    def generate(self, prompt_ids, rows, config, shard_seed):
        make = self._sampling_params or vllm_sampling_params
        kwargs = sampling_kwargs(config, self.eos_ids)
        params = [make(**kwargs, seed=request_seed(config.seed, r, config.num_samples)) for r in rows]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], sampling_params=params,
                                    use_tqdm=False)
        return [[truncate_after_eos(list(o.token_ids), self.eos_ids) for o in out.outputs] for out in outputs]


class ServerGenerator:
    """Generates through TRL's ``VLLMClient`` (``trl vllm-serve``): one request per prompt, so each carries its own
    seed (a request's seed applies to all its prompts), sent ``concurrency`` at a time; the server batches them."""

    def __init__(self, client, eos_ids, *, on_prepare=None, concurrency: int = 32):
        self.client, self.eos_ids, self.concurrency = client, list(eos_ids), concurrency
        self.name = f"vllm-server:{getattr(client, 'model', '')}"
        self._on_prepare = on_prepare

    def prepare(self):
        if self._on_prepare is not None:
            self._on_prepare()

    def finish(self):
        pass

    def generate(self, prompt_ids, rows, config, shard_seed):
        kwargs = sampling_kwargs(config, self.eos_ids)
        named = {k: kwargs.pop(k) for k in ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                            "max_tokens", "logprobs")}

        def one(i):
            extra = {**kwargs, "seed": request_seed(config.seed, rows[i], config.num_samples)}
            out = self.client.generate(prompts=[list(prompt_ids[i])], **named, generation_kwargs=extra)
            return [truncate_after_eos(list(c), self.eos_ids) for c in out["completion_ids"]]

        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompt_ids)))) as pool:
            return list(pool.map(one, range(len(prompt_ids))))


# ------------------------------------------------------------------------------------------------------ engines ---
def engine_kwargs(config) -> dict:
    """``vllm.LLM`` arguments (besides ``model``) of an offline engine, from a config with GRPOConfig's ``vllm_*``
    field names: :class:`~trl_variants.presample.PresampleConfig` (``trl-variants presample``) or
    :class:`~trl_variants.evaluate.EvalConfig` (``trl-variants evaluate``). ``vllm_model_impl`` is passed only by a
    config that has it (the offline pass leaves vLLM's own default)."""
    kwargs = dict(tensor_parallel_size=config.vllm_tensor_parallel_size,
                  gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                  max_model_len=config.vllm_max_model_length, seed=config.seed)
    if getattr(config, "vllm_model_impl", None):
        kwargs["model_impl"] = config.vllm_model_impl
    return kwargs


def offline_generator(model, tokenizer, config, accelerator=None) -> VLLMGenerator:  # pragma: no cover - GPU
    """An offline engine for ``trl-variants presample --use_vllm`` and ``trl-variants evaluate --backend vllm``
    (``config``: see :func:`engine_kwargs`). One process: ``vllm.LLM`` over
    ``vllm_tensor_parallel_size`` GPUs. Several processes (``accelerate launch``): one engine per process, started by
    TRL's ``VLLMGeneration`` in colocate mode (it sets up vLLM's ``external_launcher`` under torchrun); tensor
    parallelism there would need every process of a group to generate the same shards, so it is refused."""
    path = model.config._name_or_path
    world = accelerator.num_processes if accelerator is not None else 1
    if world == 1:
        from vllm import LLM

        llm = LLM(model=path, **engine_kwargs(config))
    else:
        if config.vllm_tensor_parallel_size != 1:
            raise ValueError(f"vllm_tensor_parallel_size={config.vllm_tensor_parallel_size} with {world} processes: "
                             "the offline pass runs one vLLM engine per process (data parallel). Run it as one "
                             "process with --vllm_tensor_parallel_size N (vLLM spreads over N GPUs), or with several "
                             "processes and --vllm_tensor_parallel_size 1")
        from accelerate import Accelerator
        from trl.generation.vllm_generation import VLLMGeneration

        impl = {"model_impl": config.vllm_model_impl} if getattr(config, "vllm_model_impl", None) else {}
        llm = VLLMGeneration(model=model, accelerator=Accelerator(), processing_class=tokenizer, mode="colocate",
                             gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                             max_model_length=config.vllm_max_model_length, **impl).llm

    def free():
        import gc

        import torch

        nonlocal llm
        del llm
        gc.collect()
        torch.cuda.empty_cache()

    return VLLMGenerator(llm, eos_token_ids(tokenizer, model), on_finish=free)


def trainer_hf_generator(trainer):
    """How a trainer generates with transformers: None (``generate``) or, with GRPOConfig's
    ``use_transformers_continuous_batching`` (with ``transformers_continuous_batching_config``, ``max_memory_percent``
    0.5 unless set, as TRL sizes it beside training) or ``cache_implementation``, a
    :class:`~trl_variants.presample.hf_backend.HFGenerator` with them (whether or not the trainer uses vLLM)."""
    args = getattr(trainer, "args", None)
    continuous = bool(getattr(trainer, "use_transformers_continuous_batching", False))
    cache = getattr(args, "cache_implementation", None)
    if not continuous and cache is None:
        return None
    from .hf_backend import HFGenerator

    options = None
    if continuous:
        options = getattr(args, "transformers_continuous_batching_config", None) or {}
        if isinstance(options, str):  # GRPOConfig parses the JSON string; a hand-built args may not have
            import json

            options = json.loads(options)
        options = {"max_memory_percent": 0.5, **options}
    return HFGenerator(continuous_batching=continuous, continuous_batching_config=options, cache_implementation=cache)


def trainer_generator(trainer):
    """The generator of a trainer's offline pass: without ``use_vllm`` transformers on the pass's model, as the trainer
    generates (:func:`trainer_hf_generator`); with
    ``vllm_mode="colocate"`` the trainer's own engine, after pushing the trainer's weights into it with TRL's
    ``sync_weights``; with ``"server"`` TRL's ``VLLMClient`` (weights pushed the same way first; processes other than
    the main one, which has no client, open one for generation only)."""
    if not getattr(trainer, "use_vllm", False):
        return trainer_hf_generator(trainer)
    engine = trainer.vllm_generation
    eos = eos_token_ids(trainer.processing_class, trainer.model)
    if engine.mode == "colocate":
        if engine.tensor_parallel_size > 1:
            raise ValueError(f"{type(trainer).__name__}'s offline pass cannot share a tensor-parallel colocated engine "
                             f"(vllm_tensor_parallel_size={engine.tensor_parallel_size}): the processes of a group "
                             "would have to generate the same shards. Presample first (`trl-variants presample "
                             "--use_vllm --vllm_tensor_parallel_size N` with the trainer's options) and pass the "
                             "result as train_dataset, or use vllm_tensor_parallel_size=1 or vllm_mode='server'")
        sleeps = engine.enable_sleep_mode

        def prepare():
            engine.sync_weights()  # wakes the weights up in sleep mode
            if sleeps:
                engine.llm.wake_up(tags=["kv_cache"])

        def finish():
            if sleeps:  # back to sleep; TRL pushes the weights again before its first generation
                engine.llm.sleep(level=2)

        return VLLMGenerator(engine.llm, eos, on_prepare=prepare, on_finish=finish)
    client = getattr(engine, "vllm_client", None)
    if client is None:  # not the main process
        from trl.generation.vllm_client import VLLMClient

        url = engine.server_base_url or f"http://{engine.server_host}:{engine.server_port}"
        client = VLLMClient(base_url=url, connection_timeout=engine.server_timeout)
    return ServerGenerator(client, eos, on_prepare=engine.sync_weights)


def timed(generate, *args):
    """``(samples, seconds, generated tokens)`` of one generate call."""
    start = time.perf_counter()
    samples = generate(*args)
    return samples, time.perf_counter() - start, sum(len(c) for per_prompt in samples for c in per_prompt)
