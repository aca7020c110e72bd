import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_variants import EEPOConfig, EEPOTrainer, accuracy_reward
from trl_variants.eepo.config import check_whole_groups
from trl_variants.losses import unlearning_loss

from ..helpers import (
    DEFAULT_MODEL_PATH,
    assert_exactly_grpo,
    assert_same_rollout,
    fixed_batch,
    grpo_trainer,
    needs_continuous_batching,
    needs_reading_while_generating,
    run_two_ranks,
    small_config,
    train_dataset,
)


def _eepo(tmp_path, **kw):
    kw.setdefault("entropy_gate", "always")
    return EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                       args=small_config(EEPOConfig, tmp_path / "eepo", **kw), train_dataset=train_dataset())


def _prompt_rows(trainer, n_prompts=2):
    tok = trainer.processing_class
    ds = trainer.train_dataset.select(range(n_prompts))
    ids = tok.apply_chat_template(list(ds["prompt"]), add_generation_prompt=True, tokenize=True, return_dict=True)
    G = trainer.num_generations
    return [ids["input_ids"][i] for i in range(n_prompts) for _ in range(G)]


def _plain_logps(model, prompts, completions, temperature=1.0):
    """Completion-token log-probs with the model's plain forward (no TRL fused head), one row at a time."""
    out = []
    for p, c in zip(prompts, completions, strict=True):
        ids = torch.tensor([p + c])
        logits = model(input_ids=ids).logits[0, :-1] / temperature
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)[-len(c):])
    return out


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_gate_off_is_exactly_grpo(tmp_path, loss_type):
    grpo = grpo_trainer(tmp_path, loss_type=loss_type)
    eepo = _eepo(tmp_path, loss_type=loss_type, entropy_gate="never")
    inputs, _ = fixed_batch(grpo)
    assert_exactly_grpo(grpo, eepo, inputs)


def test_gate_off_rolls_out_exactly_as_grpo(tmp_path):
    """The gate acts in the rollout (two half-size calls, the unlearning step, stage 2's old log-probs): with
    ``entropy_gate="never"`` EEPO samples and scores the same rollout as GRPOTrainer from the same seed."""
    grpo = grpo_trainer(tmp_path)
    eepo = _eepo(tmp_path, entropy_gate="never")
    assert_same_rollout(grpo, eepo)
    assert not any(k.startswith("eepo/") and v for k, v in eepo._metrics["train"].items())


@pytest.mark.parametrize("group", [4, 3])  # an odd G splits ceil(G/2) stage 1 + floor(G/2) stage 2
def test_rollout_restores_weights_and_stage2_old_logps_come_from_unlearned_weights(tmp_path, group):
    # a large step so the effect is far above float noise
    eepo = _eepo(tmp_path, unlearning_lr=0.5, num_generations=group, per_device_train_batch_size=2 * group)
    model = eepo.model
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    frozen = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH)  # same start weights, unpatched forward
    prompts = _prompt_rows(eepo)
    torch.manual_seed(0)
    completions, _ = eepo._generate_single_turn(prompts, None, {}, eepo.num_generations)
    old_rows = eepo._pending_old_logps

    # 1. the policy is bit-identical after the rollout, and no gradient was left behind
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.grad is None, n

    # 2. the same step, recomputed independently: plain forward, the paper's loss, one SGD step on a copy
    G, half = eepo.num_generations, (eepo.num_generations + 1) // 2
    s1 = [i for i in range(len(prompts)) if i % G < half]
    s2 = [i for i in range(len(prompts)) if i % G >= half]
    assert eepo._pending_stage2 == s2 and len(s1) == 2 * half
    logps1 = _plain_logps(frozen, [prompts[i] for i in s1], [completions[i] for i in s1])
    width = max(len(x) for x in logps1)
    padded = torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in logps1])
    mask = torch.stack([torch.nn.functional.pad(torch.ones(len(x)), (0, width - len(x))) for x in logps1])
    u = unlearning_loss(padded, mask, eepo.args.unlearning_eps_low, eepo.args.unlearning_eps_high)
    params = [p for p in frozen.parameters() if p.requires_grad]
    grads = torch.autograd.grad(u, params)
    with torch.no_grad():
        pre2 = _plain_logps(frozen, [prompts[i] for i in s2], [completions[i] for i in s2])
    unlearned = frozen
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            p.sub_(0.5 * g)
        # stage-2 old log-probs = a forward pass of the unlearned weights on the stage-2 completions
        expected2 = _plain_logps(unlearned, [prompts[i] for i in s2], [completions[i] for i in s2])
        # tolerance: TRL's fused LM-head gradient differs from plain autograd by ~1e-4 relative, times lr 0.5
        moved = []
        for k, i in enumerate(s2):
            torch.testing.assert_close(torch.tensor(old_rows[i]), expected2[k], atol=1e-2, rtol=0)
            moved.append((expected2[k] - pre2[k]).abs().max().item())
        assert max(moved) > 0.1, moved  # the step moved them far more than the tolerance
        # stage-1 old log-probs = the restored (current) policy
        expected1 = _plain_logps(model, [prompts[i] for i in s1], [completions[i] for i in s1])
        for k, i in enumerate(s1):
            torch.testing.assert_close(torch.tensor(old_rows[i]), expected1[k], atol=2e-4, rtol=1e-3)
        # 3. the step lowered the stage-1 sequence log-probs
        after1 = _plain_logps(unlearned, [prompts[i] for i in s1], [completions[i] for i in s1])
    drops = [(a.sum() - b.sum()).item() for a, b in zip(after1, expected1, strict=True)]
    assert sum(drops) / len(drops) < 0 and sum(d < 0 for d in drops) >= len(drops) - 1, drops
    assert eepo._metrics["train"]["eepo/stage1_logp_change"][-1] < 0


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_unlearning_step_kept_is_the_share_of_the_step_the_weights_kept(tmp_path, monkeypatch, weights):
    """eepo/unlearning_step_kept = sum g.(theta - theta') / (lr sum g^2): the first-order share of the step the
    weights kept. float32 weights keep the paper's step (eta 3e-3) whole; a bf16-held policy (as under DeepSpeed
    ZeRO-1/2) rounds part of it away (on this model about 0.78; on an H100 under ZeRO-2 stage 1's log-probs dropped
    74% as much as with float32 weights, results/gpu/README.md)."""
    lr = 3e-3
    kw = {"model_init_kwargs": {"dtype": torch.bfloat16}, "low_precision_weights": "allow"} if weights == "bfloat16" else {}
    eepo = _eepo(tmp_path, unlearning_lr=lr, **kw)
    eepo.model.train()
    params = [p for p in eepo.model.parameters() if p.requires_grad]
    assert {p.dtype for p in params} == {getattr(torch, weights)}
    before = [p.detach().clone() for p in params]
    grads = []
    grad = torch.autograd.grad

    def keep_grads(*a, **k):  # the unlearning gradient, for the expected value
        grads.append(grad(*a, **k))
        return grads[-1]

    monkeypatch.setattr(torch.autograd, "grad", keep_grads)
    eepo._generate_single_turn(_prompt_rows(eepo), None, {}, eepo.num_generations)
    (step_grads,) = grads
    applied = intended = 0.0
    for b, g in zip(before, step_grads, strict=True):  # theta' = theta - lr g, rounded to the weights' dtype
        applied += (g.double() * (b.double() - (b - lr * g).double())).sum().item()
        intended += lr * (g.double() ** 2).sum().item()
    kept = eepo._metrics["train"]["eepo/unlearning_step_kept"][-1]
    assert kept == pytest.approx(applied / intended, abs=1e-5)
    assert (kept > 0.999) if weights == "float32" else (0.5 < kept < 0.95)


@pytest.mark.parametrize("capture", [False, None])
def test_stage1_rescoring_only_on_logged_rollouts(tmp_path, capture):
    """Stage 2 is scored under the unlearned weights on every rollout (by default read while generating it, with
    capture_stage2_logps=False in a separate forward); stage 1 is re-scored (for the stage1_logp_change metric)
    only on rollouts whose optimizer step is logged."""
    eepo = _eepo(tmp_path, max_steps=4, logging_steps=2, unlearning_lr=0.5,  # a step large enough to show
                 capture_stage2_logps=capture)
    scored_rows = []
    score = eepo._score

    def counting_score(model, prompts, completions, entropy=False):
        if not torch.is_grad_enabled():  # the no-grad forward under the unlearned weights
            scored_rows.append(len(prompts))
        return score(model, prompts, completions, entropy)

    eepo._score = counting_score
    eepo.train()
    half_rows = eepo.args.per_device_train_batch_size // 2
    if capture is False:
        assert scored_rows == [half_rows, 2 * half_rows] * 2  # steps 1 and 3: stage 2 only; steps 2 and 4: both
    else:  # stage 2 is read while generating: only stage 1's re-scoring, on steps 2 and 4
        assert [p.capture for p in eepo.parts if p.owns_rollout] == [True]  # float32, transformers generate
        assert scored_rows == [half_rows] * 2
    logs = [h for h in eepo.state.log_history if "eepo/gate" in h]
    assert [h["step"] for h in logs] == [2, 4]
    assert all(h["eepo/stage1_logp_change"] < 0 for h in logs)


def _stage2_rollout(tmp_path, name, peft_config=None, forwards=None, **kw):
    """One unlearning rollout (G = 4, 2 prompts, a large step); returns the completions, each row's old log-probs
    and the rollout's metrics. ``forwards``: a list that receives ``(grad enabled, entropy)`` of each separate
    forward."""
    kw.setdefault("entropy_gate", "always")
    eepo = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, train_dataset=train_dataset(),
                       args=small_config(EEPOConfig, tmp_path / name, unlearning_lr=0.5, num_generations=4,
                                         per_device_train_batch_size=8, **kw), peft_config=peft_config)
    forced = kw.get("capture_stage2_logps")
    expected = forced if forced is not None else "generation_kwargs" not in kw  # the default reads, beams apart
    assert [p.capture for p in eepo.parts if p.owns_rollout] == [expected]
    if forwards is not None:
        score = eepo._score

        def recording_score(model, prompts, completions, entropy=False):
            forwards.append((torch.is_grad_enabled(), entropy))
            return score(model, prompts, completions, entropy)

        eepo._score = recording_score
    eepo.model.train()
    torch.manual_seed(0)
    completions, _ = eepo._generate_single_turn(_prompt_rows(eepo), None, {}, eepo.num_generations)
    return completions, eepo._pending_old_logps, {k: v[-1] for k, v in eepo._metrics["train"].items()}


@pytest.mark.parametrize("peft,gate", [(False, "always"), (True, "always"), (False, "auto")])
def test_stage2_logps_read_while_generating_equal_the_separate_forward(tmp_path, peft, gate):
    """capture_stage2_logps: the log-probs read from generate's own passes under the unlearned weights are the
    separate forward's (TRL's fused head) up to float32 rounding; so are the metrics. With a LoRA adapter too (the
    hook sits on the base model, which PeftModel.generate runs). With the gate on "auto" (held open here) stage 1's
    entropy is read too, then the forward with gradient runs for the unlearning step: same values."""
    import warnings

    kw = {} if gate == "always" else {"entropy_gate": "auto", "entropy_threshold": 100.0}
    if peft:
        from peft import LoraConfig

        kw["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    forwards = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="EEPO")  # a fallback to the forward would make this test vacuous
        c_read, old_read, m_read = _stage2_rollout(tmp_path, "read", forwards=forwards, **kw)  # default: read
    # the forward with gradient (the unlearning loss) runs; the gate's entropy comes from it only when not read
    assert forwards[0] == (True, gate == "always")
    c_fwd, old_fwd, m_fwd = _stage2_rollout(tmp_path, "forward", capture_stage2_logps=False, **kw)
    assert c_read == c_fwd  # same seed, same unlearned weights: the same tokens
    assert [len(r) for r in old_read] == [len(c) for c in c_read]
    for a, b in zip(old_read, old_fwd, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-4, rtol=0)
    assert m_read.keys() == m_fwd.keys()
    for k in m_fwd:
        assert m_read[k] == pytest.approx(m_fwd[k], abs=1e-5), k


@pytest.mark.parametrize("capture", [None, False])
def test_closed_gate_reads_stage1_entropy_while_generating(tmp_path, capture):
    """Gate on "auto" and closed: stage 1's entropy is read from generate's own passes, so the rollout runs no
    forward at all (capture_stage2_logps=False: the one forward with gradient, as before); the gate's entropy equals
    a separate forward's within float32 rounding, and every row's old log-probs are TRL's (no unlearning)."""
    eepo = _eepo(tmp_path, entropy_gate="auto", entropy_threshold=1e-9, num_generations=4,
                 per_device_train_batch_size=8, capture_stage2_logps=capture)
    forwards = []
    score = eepo._score

    def counting_score(model, prompts, completions, entropy=False):
        forwards.append(torch.is_grad_enabled())
        return score(model, prompts, completions, entropy)

    eepo._score = counting_score
    eepo.model.train()
    prompts = _prompt_rows(eepo)
    torch.manual_seed(0)
    completions, _ = eepo._generate_single_turn(prompts, None, {}, eepo.num_generations)
    assert eepo._metrics["train"]["eepo/gate"] == [0.0] and eepo._pending_old_logps is None
    assert forwards == ([] if capture is None else [True])
    s1 = [i for i in range(len(prompts)) if i % 4 < 2]
    with torch.no_grad():
        _, ent, mask = score(eepo.model, [prompts[i] for i in s1], [completions[i] for i in s1], entropy=True)
    expected = ((ent * mask).sum() / mask.sum()).item()
    assert eepo._metrics["train"]["eepo/entropy_stage1"][-1] == pytest.approx(expected, abs=1e-5)
    assert eepo._metrics["train"]["eepo/entropy_stage1"][-1] > 1e-3  # a real entropy, not an empty read


@pytest.mark.parametrize("gate", ["always", "auto"])
def test_stage2_read_falls_back_to_the_forward_with_a_warning(tmp_path, gate):
    """Beam search feeds several hypotheses per row: what the passes saw is not the completions, so stage 2 is
    scored in a separate forward (same values), with a warning; the default does not even try with beams. With the
    gate on "auto" (held open) stage 1's read fails first: one warning, then the forwards for both stages."""
    kw = {} if gate == "always" else {"entropy_gate": "auto", "entropy_threshold": 100.0}
    stage = 2 if gate == "always" else 1
    with pytest.warns(UserWarning, match=f"generating stage {stage} do not match its completions") as record:
        c_read, old_read, _ = _stage2_rollout(tmp_path, "forced", capture_stage2_logps=True,
                                              generation_kwargs={"num_beams": 2}, **kw)
    assert sum("do not match its completions" in str(w.message) for w in record) == 1
    c_fwd, old_fwd, _ = _stage2_rollout(tmp_path, "forward", capture_stage2_logps=False,
                                        generation_kwargs={"num_beams": 2}, **kw)
    assert c_read == c_fwd and old_read == old_fwd
    eepo = _eepo(tmp_path / "auto", generation_kwargs={"num_beams": 2})
    assert [p.capture for p in eepo.parts if p.owns_rollout] == [False]


def test_reading_while_generating_by_hand():
    """The hook's bookkeeping on hand-made passes: step t's distribution gathered at the token step t + 1 feeds back,
    the last token read from the completion; a pass it cannot read (no token ids) or a mismatch gives None."""
    from types import SimpleNamespace

    from trl_variants.eepo.part import _LogpsWhileGenerating

    logits = [torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 3.0, 0.0]])]
    reader = _LogpsWhileGenerating(torch.nn.Identity(), temperature=2.0)
    reader._read(None, (), {"input_ids": torch.tensor([[5, 6], [5, 7]])}, SimpleNamespace(logits=logits[0][:, None]))
    reader._read(None, (), {"input_ids": torch.tensor([[2], [0]])}, SimpleNamespace(logits=logits[1][:, None]))
    completions = [[2, 1], [0]]  # the second row ended after one token (its second column is masked)
    logps, ent, mask = reader.scores(completions)
    expected = [[torch.log_softmax(logits[0][0] / 2, -1)[2], torch.log_softmax(logits[1][0] / 2, -1)[1]],
                [torch.log_softmax(logits[0][1] / 2, -1)[0], 0.0]]
    torch.testing.assert_close(logps, torch.tensor(expected))
    p0 = torch.softmax(logits[0][0] / 2, -1)
    torch.testing.assert_close(ent[0, 0], -(p0 * p0.log()).sum())
    assert mask.tolist() == [[1, 1], [1, 0]] and ent[1, 1] == 0
    assert reader.scores([[1, 1], [0]]) is None  # the token fed back (2) is not the completion's (1)
    assert reader.scores([[2, 1, 3], [0]]) is None  # more tokens than passes
    blind = _LogpsWhileGenerating(torch.nn.Identity(), temperature=1.0)
    blind._read(None, (), {"inputs_embeds": torch.zeros(2, 1, 4)}, SimpleNamespace(logits=logits[0][:, None]))
    assert blind.unreadable and blind.scores([[2], [0]]) is None


def test_reading_passes_after_the_last_token_by_hand():
    """Under FSDP / ZeRO-3 with several processes ``generate`` steps every process until all are done
    (``synced_gpus``), and on MPS it stops one step late: passes after a call's last token. The first feeds the last
    token back (its log-prob, as the last pass's distribution gives it); the rest feed it again, with the cache
    moving on. Where they are expected (``passes_after_end``: the rollout sets it there) the read is the one without
    them. Before, it was refused, and under FSDP the processes that saw such passes fell back to a separate forward, a
    collective the others never joined (the run hung)."""
    from types import SimpleNamespace

    from trl_variants.eepo.part import _LogpsWhileGenerating

    logits = [torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 3.0, 0.0]])]
    after = [torch.tensor([[4.0, 0.0, 1.0], [0.0, 0.0, 5.0]]), torch.tensor([[0.0, 7.0, 1.0], [1.0, 0.0, 0.0]])]

    def read(extra: int, last_fed=(1, 0), expected=True):
        reader = _LogpsWhileGenerating(torch.nn.Identity(), temperature=2.0, passes_after_end=expected)
        reader._read(None, (), {"input_ids": torch.tensor([[5, 6], [5, 7]])}, SimpleNamespace(logits=logits[0][:, None]))
        reader._read(None, (), {"input_ids": torch.tensor([[2], [0]])}, SimpleNamespace(logits=logits[1][:, None]))
        for step in after[:extra]:  # generate feeds the last token (row 2: a pad, it had ended) again and again
            reader._read(None, (), {"input_ids": torch.tensor([list(last_fed)]).T}, SimpleNamespace(logits=step[:, None]))
        return reader.scores([[2, 1], [0]])

    plain = read(0)
    for extra in (1, 2):
        for got, expected in zip(read(extra), plain, strict=True):
            torch.testing.assert_close(got, expected)
    assert read(2, last_fed=(2, 0)) is None  # a pass fed back a token that is not the completion's last
    assert read(1, expected=False) is None  # where generate stops at the last token, such a pass is another path


def test_processes_agree_on_reading_while_generating():
    """When any process cannot use what it read, none does: under FSDP the separate forward that replaces the read is
    a collective. Here this process read fine and another did not (the sum of 'cannot' flags is 1)."""
    from types import SimpleNamespace

    from trl_variants.eepo.part import TwoStageRollout, _LogpsWhileGenerating

    reader = _LogpsWhileGenerating(torch.nn.Identity(), temperature=1.0)
    reader._read(None, (), {"input_ids": torch.tensor([[5, 6]])}, SimpleNamespace(logits=torch.zeros(1, 1, 3)))
    assert reader.scores([[2]]) is not None
    flags = []

    def reduce(t, op):
        flags.append((t.item(), op))
        return t + 1  # another process's flag

    trainer = SimpleNamespace(accelerator=SimpleNamespace(num_processes=2, device=torch.device("cpu"), reduce=reduce))
    part = TwoStageRollout()
    part.capture = True
    with pytest.warns(UserWarning, match="generating stage 1 do not match"):
        assert part._read(trainer, reader, [[2]], stage=1) is None
    assert flags == [(0.0, "sum")] and not part.capture  # never tried again, on any process


def test_reading_several_generate_calls_by_hand():
    """Several generate calls in one context (a generation path that samples row by row): a pass whose KV cache holds
    only its own tokens starts a new call, whose rows follow the previous call's; each call is read as one."""
    from types import SimpleNamespace

    from trl_variants.eepo.part import _LogpsWhileGenerating

    class Cache:  # what transformers caches expose: the tokens they hold after the pass
        def __init__(self, n):
            self.n = n

        def get_seq_length(self):
            return self.n

    a = [torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[1.0, 1.0, 0.0]])]  # call 1: one row, two steps
    b = [torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])]  # call 2: two rows, one step
    reader = _LogpsWhileGenerating(torch.nn.Identity(), temperature=1.0)
    reader._read(None, (), {"input_ids": torch.tensor([[5, 6, 7]]), "past_key_values": Cache(3)},
                 SimpleNamespace(logits=a[0][:, None]))
    reader._read(None, (), {"input_ids": torch.tensor([[2]]), "past_key_values": Cache(4)},
                 SimpleNamespace(logits=a[1][:, None]))
    reader._read(None, (), {"input_ids": torch.tensor([[5, 6], [5, 7]]), "cache": Cache(2)},  # transformers' new name
                 SimpleNamespace(logits=b[0][:, None]))
    logps, ent, mask = reader.scores([[2, 1], [0], [2]])
    ls = [torch.log_softmax(x, -1) for x in (a[0][0], a[1][0], b[0][0], b[0][1])]
    torch.testing.assert_close(logps, torch.stack([torch.stack([ls[0][2], ls[1][1]]), torch.stack([ls[2][0], torch.tensor(0.0)]),
                                                   torch.stack([ls[3][2], torch.tensor(0.0)])]))
    assert mask.tolist() == [[1, 1], [1, 0], [1, 0]]
    torch.testing.assert_close(ent[2, 0], -(ls[3].exp() * ls[3]).sum())
    assert reader.scores([[2, 1], [0]]) is None  # fewer completions than rows read
    assert reader.scores([[2], [0], [2]]) is None  # call 1 ran two steps: its row has two tokens


@needs_reading_while_generating
def test_reading_row_by_row_generation_equals_the_forward():
    """The read around generate calls of one row each (as the 2-process harness samples) equals a plain forward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_variants.eepo.part import _LogpsWhileGenerating

    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_PATH).eval()
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_PATH)
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"] for t in ("What is 4 + 7?", "What is 12 + 5 + 3?")]
    torch.manual_seed(0)
    completions = []
    with torch.no_grad(), _LogpsWhileGenerating(model, temperature=1.5) as reader:
        for p in prompts:
            out = model.generate(torch.tensor([p]), do_sample=True, temperature=1.5, max_new_tokens=12)[0, len(p):]
            c = out.tolist()
            completions.append(c[: c.index(tok.eos_token_id) + 1] if tok.eos_token_id in c else c)
    logps, _, mask = reader.scores(completions)
    assert len(reader.calls) == 2 and mask.sum().item() == sum(len(c) for c in completions)
    assert min(len(c) for c in completions) > 3  # real completions, not an immediate end of sequence
    with torch.no_grad():
        expected = _plain_logps(model, prompts, completions, temperature=1.5)
    for i, e in enumerate(expected):
        torch.testing.assert_close(logps[i, : len(e)], e, atol=1e-4, rtol=0)


@needs_continuous_batching
def test_capture_stage2_logps_rule():
    """None reads while generating only where that gives the forward's values; True/False force."""
    from types import SimpleNamespace

    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from trl_variants.eepo.part import _captures_stage2

    tiny = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                num_key_value_heads=1)

    def trainer(capture=None, bf16=False, vllm=False, beams=1, dtype=torch.float32, model=None):
        model = model if model is not None else LlamaForCausalLM(LlamaConfig(**tiny))
        return SimpleNamespace(
            args=SimpleNamespace(capture_stage2_logps=capture, bf16=bf16, fp16=False), use_vllm=vllm,
            use_transformers_continuous_batching=False, generation_config=SimpleNamespace(num_beams=beams),
            model=model.to(dtype), accelerator=SimpleNamespace(unwrap_model=lambda m: m))

    assert _captures_stage2(trainer()) is True
    # absolute position embeddings: generate numbers a left-padded row's positions from its first token, a training
    # forward from the first pad, so the values differ
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=1, vocab_size=8, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0))
    assert _captures_stage2(trainer(model=gpt2)) is False
    # length-dependent RoPE, and dropout left on (a random forward)
    assert _captures_stage2(trainer(model=LlamaForCausalLM(LlamaConfig(
        **tiny, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})))) is False
    assert _captures_stage2(trainer(model=LlamaForCausalLM(LlamaConfig(**tiny, attention_dropout=0.1)))) is False
    assert _captures_stage2(trainer(bf16=True)) is False
    assert _captures_stage2(trainer(vllm=True)) is False
    assert _captures_stage2(trainer(beams=2)) is False
    assert _captures_stage2(trainer(dtype=torch.bfloat16)) is False
    assert _captures_stage2(trainer(capture=True, bf16=True)) is True
    assert _captures_stage2(trainer(capture=False)) is False
    with pytest.raises(ValueError, match="capture_stage2_logps=True with use_transformers_continuous_batching"):
        EEPOConfig(output_dir="x", use_cpu=True, bf16=False, capture_stage2_logps=True,
                   use_transformers_continuous_batching=True)


def test_optimizer_state_and_accumulated_grads_untouched(tmp_path):
    eepo = _eepo(tmp_path, max_steps=1)
    eepo.train()  # one real step: the optimizer now has state
    opt_state = copy.deepcopy(eepo.optimizer.state_dict())
    model = eepo.model
    model.train()
    for p in model.parameters():  # pretend a gradient-accumulation window is open
        p.grad = torch.full_like(p, 0.125)
    rows = [dict(eepo.train_dataset[i]) for i in (0, 1) for _ in range(eepo.num_generations)]
    eepo._generate_and_score_completions(rows)
    assert all(torch.equal(p.grad, torch.full_like(p, 0.125)) for p in model.parameters())
    new_state = eepo.optimizer.state_dict()
    for k, v in opt_state["state"].items():
        for name, t in v.items():
            assert torch.equal(torch.as_tensor(t), torch.as_tensor(new_state["state"][k][name])), (k, name)


def test_gate_follows_moving_average(tmp_path):
    eepo = _eepo(tmp_path, entropy_gate="auto", entropy_threshold=0.3, entropy_window=2)
    eepo.model.train()
    prompts = _prompt_rows(eepo, 1)
    eepo._entropy_history.extend([0.0])  # a collapsed past step: the average falls below alpha
    eepo._generate_single_turn(prompts, None, {}, eepo.num_generations)
    h = eepo._metrics["train"]["eepo/entropy_stage1"][-1]
    assert eepo._metrics["train"]["eepo/entropy_moving_avg"][-1] == pytest.approx(h / 2)
    assert eepo._metrics["train"]["eepo/gate"][-1] == float(h / 2 < 0.3)
    eepo._entropy_history.clear()
    eepo._entropy_history.extend([5.0, 5.0])  # high entropy: no unlearning
    eepo._generate_single_turn(prompts, None, {}, eepo.num_generations)
    assert eepo._metrics["train"]["eepo/gate"][-1] == 0.0 and eepo._pending_old_logps is None


def test_config_validation():
    common = dict(output_dir="x", use_cpu=True, bf16=False)
    EEPOConfig(num_generations=3, per_device_train_batch_size=6, **common)  # odd G: split 2 + 1 (was refused)
    with pytest.raises(ValueError, match="6 \\* 1 = 6 is not a multiple of num_generations = 4"):
        check_whole_groups(6, 1, 4)  # e.g. 2 processes sharing a generation batch of 12 rows
    check_whole_groups(6, 2, 4)
    with pytest.raises(ValueError, match="entropy_gate"):
        EEPOConfig(num_generations=4, per_device_train_batch_size=8, entropy_gate="sometimes", **common)


@pytest.mark.slow
def test_end_to_end_gate_on_save_resume(tmp_path):
    out = tmp_path / "run"
    kw = dict(max_steps=2, save_strategy="steps", save_steps=2, output_dir=str(out), entropy_gate="always")
    trainer = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                          args=small_config(EEPOConfig, tmp_path, **kw), train_dataset=train_dataset())
    trainer.train()
    logged = {k for h in trainer.state.log_history for k in h}
    for key in ("eepo/entropy_stage1", "eepo/entropy_stage2", "eepo/entropy_moving_avg", "eepo/gate",
                "eepo/unlearning_loss", "eepo/stage1_logp_change", "reward", "entropy", "clip_ratio/region_mean"):
        assert key in logged, key
    history = list(trainer._entropy_history)
    assert len(history) == 2
    assert "eepo" in (out / "README.md").read_text()
    kw.update(max_steps=3)  # a resume must keep entropy_gate (trainers_tests/reliability/test_checkpoints.py)
    resumed = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward,
                          args=small_config(EEPOConfig, tmp_path, **kw), train_dataset=train_dataset())
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert resumed.state.global_step == 3
    assert list(resumed._entropy_history)[:2] == history  # gate state came back from the checkpoint


@pytest.mark.slow
def test_two_process_ddp_training_keeps_ranks_in_sync(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(f"""
import torch
torch.set_num_threads(1)
from accelerate.utils import gather_object
from trl_variants import EEPOConfig, EEPOTrainer, accuracy_reward, load_default_dataset
from trl_variants.default import DEFAULT_MODEL_PATH
args = EEPOConfig(output_dir={str(tmp_path / 'out')!r}, use_cpu=True, bf16=False, gradient_checkpointing=False,
                  report_to="none", save_strategy="no", per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=16, max_steps=2, entropy_gate="always", learning_rate=1e-3, disable_tqdm=True)
t = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=accuracy_reward, args=args,
                train_dataset=load_default_dataset(64, 4)["train"])
assert t.accelerator.num_processes == 2
t.train()
digest = float(sum(p.double().sum() for p in t.model.parameters()))
digests = gather_object([digest])
assert digests[0] == digests[1], digests
assert any("eepo/gate" in h for h in t.state.log_history)
print("OK", digests)
""")
    run_two_ranks(script, 29531)


def test_the_gates_window_counts_steps_when_dynamic_sampling_samples_several_rounds(tmp_path):
    """Each refill round runs the two-stage rollout and reads stage 1's entropy; the moving average's window (m = 3
    steps) took one entry per round, so it spanned the last rounds of one step. A step is one entry now: the mean
    of its rounds' stage-1 entropies (what the step's logged eepo/entropy_stage1 is)."""
    from ..dapo.test_trainer import first_group_wrong_reward

    eepo = EEPOTrainer(model=DEFAULT_MODEL_PATH, reward_funcs=first_group_wrong_reward, train_dataset=train_dataset(16),
                       args=small_config(EEPOConfig, tmp_path, entropy_gate="auto", dynamic_sampling=True,
                                         dynamic_sampling_max_rounds=3, max_steps=2, max_completion_length=16,
                                         logging_steps=1))
    eepo.train()
    logs = [row for row in eepo.state.log_history if "eepo/entropy_stage1" in row]
    assert len(logs) == 2 and any(row["dynamic_sampling/rounds"] > 1 for row in logs)
    history = list(eepo.part("eepo_two_stage_rollout").entropy_history)
    assert len(history) == 2
    assert history == pytest.approx([row["eepo/entropy_stage1"] for row in logs], rel=1e-4)
