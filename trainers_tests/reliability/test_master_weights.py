"""bf16/fp16 weights with no fp32 master copy: updates below the weights' resolution vanish (bf16 keeps 8 significant
bits; the paper recipes train at lr 1e-6). The trainers load such a policy in float32 (``low_precision_weights:
upcast``, the default), refuse it, or keep it when told to (trl_variants/_numerics.py)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_variants._numerics import check_master_weights, has_master_weights, mixed_precision

from ..helpers import DEFAULT_MODEL_PATH, TRAINERS, small_config, small_trainer


def _moved(trainer, before) -> float:
    """Share of the weights' entries that training changed."""
    changed = total = 0
    for name, p in trainer.model.named_parameters():
        changed += (p.detach().float() != before[name]).sum().item()
        total += p.numel()
    return changed / total


def _train_bf16(tmp_path, **overrides):
    trainer = small_trainer("erpo", tmp_path, learning_rate=1e-6, max_steps=2, lr_scheduler_type="constant",
                            model_init_kwargs={"dtype": "bfloat16"}, **overrides)
    before = {n: p.detach().float().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    return trainer, _moved(trainer, before)


def test_bf16_policy_at_lr_1e6_moves_only_with_fp32_weights(tmp_path):
    held, moved_bf16 = _train_bf16(tmp_path / "allow", low_precision_weights="allow")
    assert held.model.dtype == torch.bfloat16
    assert moved_bf16 < 0.01  # AdamW's ~1e-6 steps round away at bf16's resolution: almost nothing moves
    upcast, moved_fp32 = _train_bf16(tmp_path / "upcast")  # the default
    assert upcast.model.dtype == torch.float32 and upcast.args.model_init_kwargs["dtype"] == "float32"
    assert moved_fp32 > 0.5  # in float32 the same updates land


@pytest.mark.parametrize("method", list(TRAINERS))
def test_refuse_stops_before_the_model_loads(tmp_path, method, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_load)
    monkeypatch.setattr("transformers.LlamaForCausalLM.from_pretrained", no_load)
    with pytest.raises(ValueError, match=rf"{TRAINERS[method][0].__name__} would train bfloat16 weights with no fp32 "
                                         r"master copy.*learning_rate=0.001.*Fix: drop dtype: bfloat16.*zero2.yaml"):
        small_trainer(method, tmp_path, model_init_kwargs={"dtype": "bfloat16"}, low_precision_weights="refuse")


def test_a_bf16_model_object_is_refused_naming_model_float(tmp_path):
    from trl_variants import ERPOConfig

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.float16)
    args = small_config(ERPOConfig, tmp_path)
    with pytest.raises(ValueError, match=r"would train float16 weights.*call model\.float\(\)"):
        check_master_weights(model, args, "ERPOTrainer")
    check_master_weights(model.float(), args, "ERPOTrainer")  # float32: nothing to say


def test_the_rule_leaves_alone_what_keeps_master_weights(tmp_path, monkeypatch):
    from peft import LoraConfig

    from trl_variants import ERPOConfig

    args = small_config(ERPOConfig, tmp_path, model_init_kwargs={"dtype": "bfloat16"}, low_precision_weights="refuse")
    check_master_weights(DEFAULT_MODEL_PATH, args, "ERPOTrainer", peft_config=LoraConfig())  # adapters in float32
    assert not has_master_weights(args)  # bf16 off: no mixed precision, so no master copy either
    args.bf16 = True
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # what `accelerate launch` with a DeepSpeed config sets
    assert has_master_weights(args)
    check_master_weights(DEFAULT_MODEL_PATH, args, "ERPOTrainer")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert has_master_weights(args)
    with pytest.raises(ValueError, match="low_precision_weights must be one of"):
        ERPOConfig(output_dir=str(tmp_path), use_cpu=True, low_precision_weights="bf16")


def test_the_rule_reads_the_launchers_mixed_precision(tmp_path, monkeypatch):
    """``accelerate launch`` with an FSDP or DeepSpeed config whose ``mixed_precision`` is bf16 turns bf16 on even with
    ``bf16: false`` in the training config (transformers reads ACCELERATE_MIXED_PRECISION), and FSDP / DeepSpeed then
    keep float32 master weights: the rule must accept a bf16 policy there (real FSDP2: distributed/test_fsdp2.py)."""
    from trl_variants import ERPOConfig

    args = small_config(ERPOConfig, tmp_path, model_init_kwargs={"dtype": "bfloat16"}, low_precision_weights="refuse")
    assert not args.bf16 and mixed_precision(args) is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="would train bfloat16 weights with no fp32 master copy"):
        check_master_weights(DEFAULT_MODEL_PATH, args, "ERPOTrainer")  # FSDP without mixed precision: no master copy
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch --mixed_precision bf16` sets
    assert mixed_precision(args) == "bf16" and has_master_weights(args)
    check_master_weights(DEFAULT_MODEL_PATH, args, "ERPOTrainer")
    assert args.model_init_kwargs["dtype"] == "bfloat16"  # left in bf16: FSDP upcasts it and keeps the master copy
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    with pytest.raises(ValueError, match="would train bfloat16 weights"):  # plain DDP with bf16 autocast: none
        check_master_weights(DEFAULT_MODEL_PATH, args, "ERPOTrainer")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")  # fp8 runs the rest in bf16, FSDP keeps master weights
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert mixed_precision(args) == "bf16" and has_master_weights(args)


def test_deepspeed_bf16_from_the_launcher_only_is_refused_before_anything_loads(tmp_path, monkeypatch):
    """transformers refuses a DeepSpeed config running bf16 (accelerate launch's mixed_precision) under a training
    config with bf16 off, but only inside train(), after the model load and the offline pass: refused up front."""
    from trl_variants import ERPOConfig
    from trl_variants._config_checks import check_common

    config = small_config(ERPOConfig, tmp_path)  # the check ERPOConfig.__post_init__ runs first (no deepspeed here)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    with pytest.raises(ValueError, match=r"runs bf16 .* ERPOConfig\.bf16 is false.*--bf16 true, or launch with "
                                         r"--mixed_precision no"):
        check_common(config)
    config.bf16 = True
    check_common(config)
    config.bf16 = False
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    check_common(config)



def test_dtype_auto_reads_the_checkpoints_dtype(tmp_path):
    """dtype: auto loads a checkpoint in its own dtype (bf16 for most real models): read from its config first."""
    from trl_variants import ERPOConfig

    bf16_copy = tmp_path / "bf16_model"
    AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH, dtype=torch.bfloat16).save_pretrained(bf16_copy)
    args = small_config(ERPOConfig, tmp_path, model_init_kwargs={"dtype": "auto"})
    check_master_weights(str(bf16_copy), args, "ERPOTrainer")
    assert args.model_init_kwargs["dtype"] == "float32"  # upcast, as for dtype: bfloat16
    args = small_config(ERPOConfig, tmp_path, model_init_kwargs={"dtype": "auto"})
    check_master_weights(DEFAULT_MODEL_PATH, args, "ERPOTrainer")  # a float32 checkpoint: left as it is
    assert args.model_init_kwargs["dtype"] == "auto"


@pytest.mark.parametrize("method", list(TRAINERS))
def test_fsdp_lm_head_cast_with_a_reference_is_refused_before_the_model_loads(tmp_path, method, monkeypatch):
    """TRL casts the reference model's lm_head to float32 and FSDP2 refuses its mixed dtypes at the first rollout
    (``check_distributed_backends.py --paper --extra="--cast_lm_head_to_fp32 true"``: EEPO and A*-PO, whose recipes
    have a KL term; TRL's GRPOTrainer too)."""
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch --config_file fsdp2.yaml` sets
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_load)
    monkeypatch.setattr("transformers.LlamaForCausalLM.from_pretrained", no_load)
    bf16 = dict(model_init_kwargs={"dtype": "bfloat16"}, cast_lm_head_to_fp32=True)
    with pytest.raises(ValueError, match=rf"{TRAINERS[method][0].__name__}: cast_lm_head_to_fp32 with a bfloat16 "
                                         r"policy, beta=0.01 .*FSDP.*uniform original parameter dtype.*Fix: drop "
                                         r"cast_lm_head_to_fp32.*dtype: float32.*zero2.yaml"):
        small_trainer(method, tmp_path, beta=0.01, **bf16)
    # no reference (beta 0), or float32 weights: not refused (the load starts)
    for kwargs in (dict(bf16, beta=0.0), dict(cast_lm_head_to_fp32=True, beta=0.01)):
        if method == "apo" and kwargs["beta"] == 0.0:
            continue  # A*-PO's beta is its beta_2 > 0
        with pytest.raises(AssertionError, match="the model was loaded"):
            small_trainer(method, tmp_path, **kwargs)


@pytest.mark.parametrize("precision,low", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp8", torch.bfloat16)])
def test_fsdp2_policy_from_accelerate_gets_float32_outputs(precision, low, capsys):
    """Accelerate's FSDP2 policy casts every module's output (the log-probs included) to the compute dtype; the
    trainers set float32 outputs and leave the parameters' and reductions' dtype (test_fsdp2.py runs it on 2 processes).
    """
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin

    from trl_variants._numerics import float32_outputs_under_fsdp

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision(precision)  # what AcceleratorState does with the launcher's mixed_precision
    assert plugin.mixed_precision_policy.output_dtype == low
    reduce = plugin.mixed_precision_policy.reduce_dtype  # None under torch 2.6: the parameters' dtype (it was
    assert reduce in (low, None)  # taken for a policy of the user's own there, and the outputs stayed low)
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), is_main_process=True)
    assert float32_outputs_under_fsdp(accelerator, "ERPOTrainer")
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (low, reduce, torch.float32)
    assert "ERPOTrainer: FSDP mixed precision with float32 module outputs" in capsys.readouterr().out
    assert not float32_outputs_under_fsdp(accelerator, "ERPOTrainer")  # a second call: nothing left to do


def test_the_head_gets_its_input_in_its_weights_dtype_and_nothing_else_changes():
    """``head_input_in_its_dtype``: under FSDP2's float32 outputs the LM head's forward gets its input in its weights'
    dtype (torch 2.11 handed the bf16 head float32: test_fsdp2.py reproduces it on 2 processes). Nothing else: an input
    already in that dtype is passed through untouched, the backbone's output keeps its float32 (TRL's fused head
    computes its log-probs from it in float32), and without FSDP2's float32 outputs no hook is set."""
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import AutoModelForCausalLM

    from trl_variants._numerics import float32_outputs_under_fsdp, head_input_in_its_dtype
    from trl_variants.default import DEFAULT_MODEL_PATH

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), is_main_process=False)
    assert head_input_in_its_dtype(model, accelerator) is None  # Accelerate's bf16 outputs: nothing to hand over
    float32_outputs_under_fsdp(accelerator, "ERPOTrainer")
    handle = head_input_in_its_dtype(model, accelerator)
    assert handle is not None
    head = model.get_output_embeddings()
    seen = []
    head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        assert hidden.dtype == torch.float32  # the backbone's output is not touched
        head.to(torch.bfloat16)  # the head computing in bf16, as FSDP's gathered weights do
        logits = head(hidden)  # float32 in: cast to bf16 (without the hook: "expected mat1 and mat2 ...")
        assert seen[-1].dtype == torch.bfloat16 and logits.dtype == torch.bfloat16
        same = hidden.bfloat16()
        head(same)
        assert seen[-1] is same  # already in the head's dtype: passed through untouched
        head.float()
        head(hidden)
        assert seen[-1] is hidden  # float32 weights (before FSDP shards the model, the offline passes): untouched
    handle.remove()


def test_fsdp_policies_left_alone(recwarn):
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from trl_variants._numerics import float32_outputs_under_fsdp

    def accelerator(plugin):
        return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), is_main_process=True)

    assert not float32_outputs_under_fsdp(accelerator(None), "ERPOTrainer")  # no FSDP
    fsdp1 = FullyShardedDataParallelPlugin(fsdp_version=1)
    fsdp1.set_mixed_precision("bf16")  # FSDP1's MixedPrecision casts no outputs: nothing to change
    assert not float32_outputs_under_fsdp(accelerator(fsdp1), "ERPOTrainer")
    assert not float32_outputs_under_fsdp(accelerator(FullyShardedDataParallelPlugin(fsdp_version=2)), "ERPOTrainer")
    # a policy of the user's own (float32 reductions, bf16 outputs): kept, with a warning that names the fix
    own = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.bfloat16)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy=own)
    with pytest.warns(UserWarning, match=r"not Accelerate's default.*output_dtype=torch\.float32"):
        assert not float32_outputs_under_fsdp(accelerator(plugin), "ERPOTrainer")
    assert plugin.mixed_precision_policy == own
