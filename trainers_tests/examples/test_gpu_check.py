"""benchmarks/gpu_check.sh --dry-run: the commands the GPU check would run, each parsed here by the parser that will
read it on the GPU machine (a typo in a flag would otherwise cost a session's device time)."""

import importlib.util
import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _dry_run(*extra):
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run", *extra], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    return [line.split("\t") for line in out.splitlines()]


def test_dry_run_lists_every_step_within_the_budget():
    steps = _dry_run()
    names = [name for name, _, _ in steps]
    assert names == [f"smoke_{m}" for m in ("erpo", "eepo", "dph", "apo", "composed", "grpo")] + [
        "zero2_erpo", "zero2_dph", "zero2_eepo", "fsdp2_erpo", "fsdp2_dph", "fsdp2_eepo", "fsdp2_apo", "main_job",
        "evaluate",
        "bench_hf_generate", "bench_continuous_batching"]
    for name, box, cmd in steps:
        assert int(box) <= 480, name  # no step may need more than the whole budget
        if name.startswith(("smoke_", "zero2_", "fsdp2_")) or name == "main_job":
            assert "--use_cpu false --bf16 true" in cmd, name  # on the GPU, in bf16
    ports = [shlex.split(cmd)[shlex.split(cmd).index("--main_process_port") + 1] for name, _, cmd in steps
             if name.startswith(("zero2_", "fsdp2_"))]
    assert len(set(ports)) == 7  # side by side: one rendezvous port each
    main = dict((n, c) for n, _, c in steps)["main_job"]
    assert "--max_steps" not in main  # the main job runs to its end
    assert "--continuous_batching" in dict((n, c) for n, _, c in steps)["bench_continuous_batching"]


def test_dry_run_commands_parse(tmp_path):
    from trl_variants.recipe_catalog import default_recipe
    from trl_variants.registry import method_classes
    from trl_variants.training import parse_args

    for name, _, cmd in _dry_run("--out", str(tmp_path)):
        argv = shlex.split(cmd)
        assert argv[0] == "python3", name
        if name.startswith(("zero2_", "fsdp2_")):  # accelerate's launcher with the backend's config, then the same
            from accelerate.commands.launch import launch_command_parser  # command line

            launch = launch_command_parser().parse_args(argv[3:])
            assert argv[1:3] == ["-m", "accelerate.commands.launch"] and launch.num_processes == 1, name
            backend = name.split("_")[0]
            assert launch.config_file == f"configs/accelerate/{backend}.yaml", name
            assert (ROOT / launch.config_file).is_file()
            assert launch.module and launch.training_script == "trl_variants", name
            argv = ["python3", "-m", "trl_variants", *launch.training_script_args]
        if name.startswith(("smoke_", "zero2_", "fsdp2_")) or name == "main_job":
            assert argv[1:4] == ["-m", "trl_variants", "train"], name
            method, flags = argv[4], argv[5:]
            i = flags.index("--use_cpu")  # transformers refuses bf16 without a GPU: parse it as on a CPU here
            assert flags[i + 1] == "false"
            flags[i + 1] = "true"
            _, config_cls = method_classes(method)
            script_args, training_args, _ = parse_args(config_cls, default_recipe(method), argv=flags)
            assert training_args.bf16, name
            assert training_args.output_dir.startswith(str(tmp_path)), name
        elif name == "evaluate":
            from trl_variants.cli.evaluate_command import parse_evaluate_args

            assert argv[1:4] == ["-m", "trl_variants", "evaluate"]
            script_args, config = parse_evaluate_args(argv[4:])
            assert config.k == 4 and script_args.max_prompts == 200
        else:
            spec = importlib.util.spec_from_file_location("bench_trainers", ROOT / "benchmarks/bench_trainers.py")
            bench = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(bench)
            assert argv[1] == "benchmarks/bench_trainers.py"
            args = bench.build_parser().parse_args(argv[2:])
            assert args.gpu and args.model == "qwen0.5b_shape"
            assert set(args.variants) <= set(bench.VARIANTS)
            assert args.out.startswith(str(tmp_path / "results" / "gpu"))


def test_without_a_gpu_it_says_so(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    if "no CUDA device" not in proc.stderr:
        pytest.skip("a CUDA device is visible here")
    assert proc.returncode == 1 and "use --dry-run" in proc.stderr


def test_the_training_command_says_where_it_runs(tmp_path, monkeypatch):
    """The tiny recipes keep the run on the CPU (use_cpu: true); on a machine with a GPU the command says so and
    names the flag that moves it there."""
    import torch

    from trl_variants import ERPOConfig
    from trl_variants.training import where_it_runs

    args = ERPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    assert where_it_runs(args) == "training on cpu, 1 process, fp32 compute"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert where_it_runs(args) == ("training on cpu, 1 process, fp32 compute (use_cpu: true; this machine has 2 "
                                   "GPU(s): --use_cpu false trains there, see docs/gpu.md)")
    args.deepspeed_plugin = type("Plugin", (), {"zero_stage": 2})()  # what transformers sets under DeepSpeed
    assert where_it_runs(args).startswith("training on cpu, 1 process, DeepSpeed ZeRO-2, fp32 compute")
    del args.deepspeed_plugin
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # a launcher config's mixed_precision, bf16: false here
    assert where_it_runs(args).startswith("training on cpu, 1 process, FSDP, bf16 compute")


def test_only_and_reps_pick_steps_for_a_benchmark_session():
    """`--only bench_hf_generate --reps 3 --variants ...`: one step, three repetitions of those variants, a time box
    three times as long; a name that is no step is refused, listing the steps."""
    steps = _dry_run("--only", "bench_hf_generate", "--reps", "3", "--variants", "grpo_g2_half apo")
    assert [(name, int(box)) for name, box, _ in steps] == [("bench_hf_generate", 600)]
    assert "--reps 3" in steps[0][2] and steps[0][2].endswith("--variants grpo_g2_half apo --out results/gpu/bench_hf_generate")
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--only", "bench_hf"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 2 and "names no step" in proc.stderr and "bench_hf_generate" in proc.stderr


def test_batch_runs_the_benchmarks_at_another_size_beside_the_64_row_results():
    """`--batch 256`: the benchmarks generate 256 completions a step and write bench_*_b256 beside the 64-row files
    (the default writes the plain names); a batch that is no number is refused."""
    steps = dict((name, cmd) for name, _, cmd in _dry_run("--only", "bench_continuous_batching", "--batch", "256"))
    cmd = steps["bench_continuous_batching"]
    assert "--batch 256 " in cmd and "--batch 64" not in cmd
    assert cmd.endswith("--out results/gpu/bench_continuous_batching_b256")
    assert dict((n, c) for n, _, c in _dry_run())["bench_hf_generate"].endswith("--out results/gpu/bench_hf_generate")
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--batch", "lots"], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 2 and "--batch takes a number" in proc.stderr


def _fake_python(tmp_path, deepspeed: bool):
    """A stand-in for the GPU machine's python3: it names a device, has (or lacks) deepspeed, and runs every step by
    printing an EEPO metric line, so the script's loop and report run here without a GPU."""
    fake = tmp_path / "python3"
    fake.write_text("#!/usr/bin/env bash\n"
                    'case "$*" in\n'
                    '  *get_device_name*) echo "Fake GPU" ;;\n'
                    f'  *"import deepspeed"*) exit {0 if deepspeed else 1} ;;\n'
                    '  *importlib.metadata*) echo "torch 0" ;;\n'
                    '  *zero2-eepo*) echo "{\'eepo/stage1_logp_change\': \'-0.15\', \'eepo/unlearning_step_kept\': \'nan\'}" ;;\n'
                    '  *smoke-eepo*) echo "{\'eepo/stage1_logp_change\': \'-0.2\', \'eepo/unlearning_step_kept\': \'1\'}" ;;\n'
                    "esac\n"
                    'echo "offline-pass cache: $TRL_VARIANTS_CACHE"\n')
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("deepspeed", [False, True])
def test_zero2_steps_run_beside_the_smoke_runs_or_say_why_not(tmp_path, deepspeed):
    """The ZeRO-2 steps run where deepspeed imports and are written down as skipped, naming the fix, where it does
    not; with both EEPO runs done the report sets their unlearning-step metric side by side."""
    stale = tmp_path / "o" / "work" / "gpu_check" / "logs" / "zero2_eepo.log"  # an earlier run's, same --out
    stale.parent.mkdir(parents=True)
    stale.write_text("{'eepo/stage1_logp_change': '-9.9'}")
    proc = subprocess.run(["bash", str(SCRIPT), "--python", str(_fake_python(tmp_path, deepspeed)), "--out",
                           str(tmp_path / "o"), "--budget", "60", "--only", "smoke_eepo,zero2_eepo,zero2_erpo"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "o" / "results" / "gpu" / "gpu_check.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in report.splitlines()
            if line.startswith(("| smoke_", "| zero2_"))}
    assert rows["smoke_eepo"] == "ok"
    for name in ("zero2_eepo", "zero2_erpo"):
        assert rows[name] == ("ok" if deepspeed else "skipped: deepspeed is not installed (--fetch-wheels carries it)")
    assert ("smoke_eepo stage1_logp_change: -0.2 \nzero2_eepo stage1_logp_change: -0.15 " in report) == deepspeed
    assert ("smoke_eepo unlearning_step_kept: 1 \nzero2_eepo unlearning_step_kept: nan " in report) == deepspeed
    assert "-9.9" not in report and ("## EEPO's unlearning step" in report) == deepspeed


def test_under_the_device_tools_out_each_step_has_its_own_cache_and_the_results_come_back_as_one_archive(tmp_path):
    """With $OUT (the device tool's folder, of which only files 2 folders down come back) and no --out: the runs'
    files stay in $TMPDIR, the results and their logs (3 folders down) come back as $OUT/gpu_check.tar.gz; each step
    gets its own offline-pass cache (the smoke and ZeRO-2 runs of DPH-RL have the same pass key, and the later one
    read the earlier one's pass instead of making its own)."""
    import tarfile

    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir(), tmp.mkdir()
    proc = subprocess.run(["bash", str(SCRIPT), "--python", str(_fake_python(tmp_path, True)), "--budget", "60",
                           "--only", "smoke_dph,zero2_dph"], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, OUT=str(out), TMPDIR=str(tmp)))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "results"]
    assert not (out / "work").exists() and (tmp / "gpu_check_work" / "logs" / "smoke_dph.log").exists()
    with tarfile.open(out / "gpu_check.tar.gz") as archive:
        names = set(archive.getnames())
        assert {"results/gpu/gpu_check.md", "results/gpu/logs/smoke_dph.log", "results/gpu/logs/zero2_dph.log"} <= names
        caches = {archive.extractfile(f"results/gpu/logs/{step}.log").read().decode().strip().splitlines()[-1]
                  for step in ("smoke_dph", "zero2_dph")}
    assert caches == {f"offline-pass cache: {tmp}/gpu_check_work/cache/{step}" for step in ("smoke_dph", "zero2_dph")}
