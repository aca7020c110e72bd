"""The options of an evaluation (:class:`EvalConfig`): samples per prompt, temperatures, sampling and batching
options, the backend (transformers or vLLM) and its engine options."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trl import GRPOConfig

BACKENDS = ("hf", "vllm")
"""What samples: transformers ``generate`` (``"hf"``) or an offline vLLM engine (``"vllm"``)."""
VLLM_EXTRA = "pip install 'trl-variants[vllm]'"


def _training_default(name: str):
    """The default of GRPOConfig's field ``name``: evaluation's vLLM engine takes training's options."""
    return GRPOConfig.__dataclass_fields__[name].default


@dataclass
class EvalConfig:
    """Options of :func:`evaluate`.

    Parameters:
        k: samples per prompt at each temperature (avg@k, pass@k' for every k' <= k).
        temperatures: sampling temperatures to sweep (ERPO sweeps 0.1-1.5).
        greedy: also measure greedy accuracy.
        top_p, max_completion_length: sampling options.
        compute_entropy: mean token entropy of the sampled completions (one scoring forward pass).
        seed: base seed (each temperature and chunk derives its own).
        generation_batch_size, logprob_batch_size: sequences per generate call / per scoring forward (fewer where
            a forward's logits would pass 2**28 values: long rows of a large vocabulary, ``presample.logprobs``).
        chunk_size: prompts per chunk, the unit of progress, of resume and of work sharing between processes (a
            chunk is seeded by its index: another chunk size gives other, equally valid samples).
        backend: ``"hf"`` (transformers generate) or ``"vllm"`` (an offline vLLM engine; needs the ``vllm`` extra
            and a CUDA GPU).
        vllm_gpu_memory_utilization, vllm_tensor_parallel_size, vllm_max_model_length, vllm_model_impl: the vLLM
            engine's options, as GRPOConfig's fields of the same names (same defaults); resources only.
        use_transformers_continuous_batching, transformers_continuous_batching_config, cache_implementation: with
            ``backend="hf"``, how transformers generates, as GRPOConfig's fields of the same names (the offline
            pass's :class:`~trl_variants.presample.PresampleConfig` options): continuous batching
            (``model.generate_batch``, one call per chunk and temperature; refused with what it would drop) and
            ``generate``'s KV cache (e.g. ``"static"``). Part of a results file's key when set.
        show_progress: show a progress bar (on the main process).
    """

    k: int = field(default=8, metadata={"help": "Samples per prompt at each temperature (avg@k, pass@k' for k' <= k)."})
    temperatures: list[float] = field(
        default_factory=lambda: [0.6, 1.0], metadata={"help": "Sampling temperatures to sweep (ERPO sweeps 0.1-1.5)."}
    )
    greedy: bool = field(default=True, metadata={"help": "Also measure greedy accuracy."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold in (0, 1] (1 = off)."})
    max_completion_length: int = field(default=64, metadata={"help": "Maximum new tokens per completion."})
    compute_entropy: bool = field(
        default=True, metadata={"help": "Mean token entropy of the sampled completions (one scoring forward pass)."}
    )
    seed: int = field(default=0, metadata={"help": "Base seed (each temperature and chunk derives its own)."})
    generation_batch_size: int = field(default=128, metadata={"help": "Sequences per generate call."})
    logprob_batch_size: int = field(default=32, metadata={"help": "Sequences per scoring forward pass (fewer where their "
                                                                         "logits would pass 2**28 values)."})
    chunk_size: int = field(
        default=64,
        metadata={"help": "Prompts per chunk: the unit of progress, of resume and of work sharing between processes "
                          "(chunks are seeded by their index: another size gives other samples)."},
    )
    backend: str = field(
        default="hf",
        metadata={"help": "What samples: 'hf' (transformers generate) or 'vllm' (an offline vLLM engine built with "
                          f"the vllm_* options below; needs {VLLM_EXTRA} and a CUDA GPU)."},
    )
    vllm_gpu_memory_utilization: float = field(
        default=_training_default("vllm_gpu_memory_utilization"),
        metadata={"help": "--backend vllm: fraction of each GPU's memory the engine may take (GRPOConfig's field; "
                          "the rest holds the transformers model that scores entropy and KL)."},
    )
    vllm_tensor_parallel_size: int = field(
        default=_training_default("vllm_tensor_parallel_size"),
        metadata={"help": "--backend vllm: GPUs the engine spreads the model over (GRPOConfig's field; one process "
                          "only)."},
    )
    vllm_max_model_length: int | None = field(
        default=_training_default("vllm_max_model_length"),
        metadata={"help": "--backend vllm: the engine's context window (prompt + completion tokens; GRPOConfig's "
                          "field); None = the model's."},
    )
    vllm_model_impl: str = field(
        default=_training_default("vllm_model_impl"),
        metadata={"help": "--backend vllm: model implementation, 'vllm' or 'transformers' (GRPOConfig's field)."},
    )
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata={"help": "--backend hf: sample with transformers' continuous batching (model.generate_batch) "
                          "instead of generate (GRPOConfig's field)."},
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata={"help": "--backend hf with continuous batching: transformers ContinuousBatchingConfig arguments "
                          "(JSON dict, e.g. '{\"max_batch_tokens\": 2048}'; GRPOConfig's field)."},
    )
    cache_implementation: str | None = field(
        default=None,
        metadata={"help": "--backend hf: the KV cache of generate, e.g. 'static' (GRPOConfig's field); None = the "
                          "model's default."},
    )
    show_progress: bool = field(default=True, metadata={"help": "Show a progress bar with an ETA."})

    # fields that do not change the numbers (left out of a results file's key)
    _NOT_IN_KEY = ("vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_max_model_length",
                   "show_progress")
    # transformers generation options, in a results file's key only when set (files written before they existed
    # keep their key)
    _HF_ENGINE_DEFAULTS = {"use_transformers_continuous_batching": False,
                           "transformers_continuous_batching_config": None, "cache_implementation": None}

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.temperatures or any(not t > 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be a non-empty list of values > 0, got {self.temperatures}")
        if len({str(float(t)) for t in self.temperatures}) != len(self.temperatures):
            raise ValueError(f"temperatures has a value twice: {self.temperatures}")
        for name in ("max_completion_length", "generation_batch_size", "logprob_batch_size", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.vllm_tensor_parallel_size < 1:
            raise ValueError(f"vllm_tensor_parallel_size must be >= 1, got {self.vllm_tensor_parallel_size}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        from ..generation import engine_config

        self.transformers_continuous_batching_config = engine_config(
            self.transformers_continuous_batching_config, f"{type(self).__name__}.transformers_continuous_batching_config")
        engine = [k for k, default in self._HF_ENGINE_DEFAULTS.items() if getattr(self, k) != default]
        if engine and self.backend != "hf":
            raise ValueError(f"{', '.join(engine)} are options of transformers generation (backend 'hf'), but "
                             f"backend={self.backend!r}: vLLM generates with its own engine. Remove them, or use "
                             "backend='hf'")
        if self.use_transformers_continuous_batching:
            from ..generation import check_continuous_batching

            check_continuous_batching(continuous_batching_config=self.transformers_continuous_batching_config)

    def key_options(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in self._NOT_IN_KEY
                and (k not in self._HF_ENGINE_DEFAULTS or v != self._HF_ENGINE_DEFAULTS[k])}
