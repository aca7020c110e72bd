"""transformers' continuous batching under DDP (two gloo ranks): each rank generates its own rows with the engine,
and the offline pass shards its prompts over the ranks. The 1-vs-2-process equivalence (test_equivalence.py) runs
with ``generate`` (it seeds every row alone, which the engine's batched sampling cannot); this test checks what must
hold with the engine: every rank generates with it, the ranks end with the same float32 weights, and they moved."""

from pathlib import Path

import pytest

from trl_variants.generation import page_size_name

from ..helpers import needs_continuous_batching, run_two_ranks


@pytest.mark.slow
@needs_continuous_batching
def test_bf16_continuous_batching_on_two_ranks_keeps_the_replicas_equal(tmp_path):
    script = tmp_path / "cb.py"
    page = page_size_name()  # "block_size" up to transformers 5.17 (what the [vllm] extra installs)
    script.write_text(f"""
import hashlib, math, sys, warnings, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
torch.set_num_threads(1)
warnings.simplefilter("ignore")
from accelerate.utils import gather_object
from transformers import GenerationMixin
from trainers_tests.helpers import small_config, train_dataset
from trl_variants import ComposedConfig, ComposedTrainer
from trl_variants.default import DEFAULT_MODEL_PATH

calls = []
engine = GenerationMixin.generate_batch
def counted(self, *args, **kwargs):
    calls.append(len(args[0]) if args else len(kwargs.get("inputs", [])))
    return engine(self, *args, **kwargs)
GenerationMixin.generate_batch = counted

def alternating(completions, **kwargs):  # 0, 1 within every group: each step has advantages to follow
    return [float(i % 2) for i in range(len(completions))]

args = small_config(ComposedConfig, {str(tmp_path / 'o')!r}, bf16=True,
                    parts=["erpo_query_weights", "dph_rehearsal", "eepo_two_stage_rollout"],
                    entropy_gate="always", capture_stage2_logps=False,
                    per_device_train_batch_size=4, num_generations=2, max_completion_length=6, max_steps=2,
                    num_presamples=4, pef_threshold=4, pef_batch_size=2, presample_cache_dir={str(tmp_path / 'cache')!r},
                    use_transformers_continuous_batching=True,
                    transformers_continuous_batching_config={{"num_blocks": 16, {page!r}: 32,
                                                              "max_batch_tokens": 256}})
t = ComposedTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=alternating, args=args, train_dataset=train_dataset(16))
rank = t.accelerator.process_index
assert t.accelerator.num_processes == 2
offline_calls = len(calls)
model = t.model
before = {{n: p.detach().clone() for n, p in model.named_parameters()}}
t.train()
assert type(t.model_wrapped).__name__ == "DistributedDataParallel" and t.accelerator.unwrap_model(t.model_wrapped) is model
assert t.state.global_step == 2 and all(math.isfinite(e["loss"]) for e in t.state.log_history if "loss" in e)
# the offline pass (16 prompts: one shard, on rank 0), then on every rank EEPO's two half-size calls in each step
assert sum(gather_object([offline_calls])) >= 1 and len(calls) == offline_calls + 2 * 2, (offline_calls, calls)
assert {{p.dtype for p in model.parameters()}} == {{torch.float32}}
assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
digests = gather_object([digest])
assert len(digests) == 2 and digests[0] == digests[1], digests
print("OK", rank)
""")
    run_two_ranks(script, 29571, timeout=400)
