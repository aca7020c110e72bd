from pathlib import Path

import pytest

from ..helpers import run_two_ranks


@pytest.mark.slow
def test_query_weights_use_the_global_batch_mean(tmp_path):
    """Two gloo ranks, different prompts on each: every rank's weights equal mean_global(l) / l(s)."""
    script = tmp_path / "w.py"
    script.write_text(f"""
import sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
torch.set_num_threads(1)
from accelerate.utils import gather_object
from trainers_tests.helpers import fixed_batch, small_config, train_dataset
from trl_variants import ERPOConfig, ERPOTrainer, accuracy_reward
from trl_variants.default import DEFAULT_MODEL_PATH
from trl_variants.presample import prompt_logps_from_ids
t = ERPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, train_dataset=train_dataset(),
                args=small_config(ERPOConfig, {str(tmp_path / 'o')!r}, query_kl_coef=0.0))
rank = t.accelerator.process_index
assert t.accelerator.num_processes == 2
batch, _ = fixed_batch(t, n_prompts=2, group=4, seed=rank)   # rank 0 and rank 1 see different prompts
t.model.train()
w = t.part("erpo_query_weights").weights(t, None, batch)
rows = [ids[m.bool()].tolist() for ids, m in zip(batch["prompt_ids"], batch["prompt_mask"])][::4]
l_all = torch.tensor(sum(gather_object([prompt_logps_from_ids(t.model, rows, 0).tolist()]), []))
expected = (l_all.mean() / l_all).repeat_interleave(4)[rank * 8:(rank + 1) * 8]
torch.testing.assert_close(w, expected, atol=1e-5, rtol=1e-5)
local_only = prompt_logps_from_ids(t.model, rows, 0)
assert not torch.allclose(w, (local_only.mean() / local_only).repeat_interleave(4), atol=1e-4)
print("OK", rank)
""")
    run_two_ranks(script, 29537)
