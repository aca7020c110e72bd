"""The multi-node recipe path: the multi-node accelerate configs load with accelerate's own
config class, and ``scripts/slurm_train.sh --dry_run`` renders, from fake SLURM variables, the commands a real job
would run: one ``accelerate launch`` per training node with its own machine rank and the job's rendezvous, the batch
flags that keep a recipe's numbers on another process count, the vLLM server on a reserved node, and a refusal where
no whole division keeps the batch. No SLURM, GPU or network needed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainers_tests.examples.test_configs import (  # noqa: F401 (bf16_anywhere is a fixture)
    CONFIGS,
    ROOT,
    batch_arithmetic,
    bf16_anywhere,
    parse_recipe,
    read_header,
)

SCRIPT = ROOT / "scripts" / "slurm_train.sh"
MULTI_NODE = sorted((CONFIGS / "accelerate").glob("multi_node_*.yaml"))
LAUNCH_FLAGS = {"--config_file", "--num_machines", "--num_processes", "--main_process_ip", "--main_process_port",
                "--rdzv_backend", "--machine_rank"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="scripts/slurm_train.sh needs bash")


def dry_run(recipe: str, *extra: str, nodes: str = "gpu-a,gpu-b", path: str | None = None, **env: str):
    """Run the launcher in dry mode with fake SLURM variables; returns the CompletedProcess."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    environment.update(SLURM_JOB_NODELIST=nodes, SLURM_GPUS_ON_NODE="8", PYTHON=sys.executable,
                       TRL_VARIANTS_ROOT=str(ROOT), **env)
    if path is not None:
        environment["PATH"] = path
    return subprocess.run(["bash", str(SCRIPT), "--dry_run", recipe, *extra], capture_output=True, text=True,
                          env=environment, cwd=ROOT, timeout=60)


def node_commands(stdout: str) -> dict[int, tuple[str, list[str]]]:
    """``{rank: (host, argv)}`` of the ``node <rank> (<host>): <command>`` lines."""
    commands = {}
    for line in stdout.splitlines():
        if line.startswith("node "):
            head, command = line.split(": ", 1)
            rank, host = head[len("node "):].split(" ")
            commands[int(rank)] = (host.strip("()"), shlex.split(command))
    return commands


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("path", MULTI_NODE, ids=lambda p: p.name)
def test_multi_node_configs_load_with_accelerate_and_leave_the_rendezvous_to_the_launcher(path):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DistributedType

    config = ClusterConfig.from_yaml_file(str(path))
    assert config.distributed_type == DistributedType.DEEPSPEED
    assert config.num_machines == 2 and config.num_processes == 16  # num_processes counts every machine's processes
    # torchrun on every machine (what srun starts), not DeepSpeed's pdsh/ssh launcher
    assert config.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
    assert config.rdzv_backend == "static" and config.main_process_port == 29500
    assert config.main_process_ip == "replace-with-the-rank-0-host"  # fails fast if no launcher fills it
    assert path.stem == f"multi_node_zero{config.deepspeed_config['zero_stage']}"


def test_two_nodes_one_launch_per_node_with_its_rank_and_the_recipes_batch_kept():
    result = dry_run("configs/erpo/qwen2.5-math-7b.yaml", "--seed", "7")
    assert result.returncode == 0, result.stderr
    commands = node_commands(result.stdout)
    assert sorted(commands) == [0, 1]
    for rank, (host, argv) in commands.items():
        assert host == ["gpu-a", "gpu-b"][rank]
        assert argv[:2] == ["accelerate", "launch"]
        assert flag(argv, "--machine_rank") == str(rank)
        assert flag(argv, "--num_machines") == "2" and flag(argv, "--num_processes") == "16"
        assert flag(argv, "--main_process_ip") == "gpu-a" and flag(argv, "--main_process_port") == "29500"
        # the recipe's launch command names zero2.yaml: its multi-node form
        assert flag(argv, "--config_file") == "configs/accelerate/multi_node_zero2.yaml"
        script = argv.index("examples/train_erpo.py")
        assert LAUNCH_FLAGS.issubset(argv[:script]), "accelerate's flags must come before the training script"
        assert flag(argv, "--config") == "configs/erpo/qwen2.5-math-7b.yaml"
        # 8 processes -> 16: gradient accumulation 32 -> 16 and steps_per_generation 128 -> 64
        assert flag(argv, "--gradient_accumulation_steps") == "16" and flag(argv, "--steps_per_generation") == "64"
        assert argv[-2:] == ["--seed", "7"]  # the user's flags last, so they win
    rank_of = commands[0][1].index("--machine_rank") + 1
    assert commands[0][1][:rank_of] + commands[0][1][rank_of + 1:] == commands[1][1][:rank_of] + commands[1][1][rank_of + 1:]
    # the srun line: one task per training node, each expanding its own $SLURM_PROCID
    train = next(line for line in result.stdout.splitlines() if line.startswith("train: "))
    srun = shlex.split(train[len("train: "):])
    assert srun[0] == "srun" and "--ntasks=2" in srun and "--ntasks-per-node=1" in srun
    assert "--nodelist=gpu-a,gpu-b" in srun and srun[-3:-1] == ["bash", "-c"]
    assert "--machine_rank $SLURM_PROCID" in srun[-1]
    assert "launching 16" in result.stdout


def rescaled_numbers(path, added: list[str], processes: int, tmp_path) -> tuple[dict, dict]:
    """The recipe's header, and the batch numbers of the recipe with the launcher's ``added`` flags applied on
    ``processes`` (``batch_arithmetic`` reads the YAML's batch fields: a copy in a folder named after the method)."""
    import yaml

    raw = yaml.safe_load(path.read_text())
    for name, value in zip(added[::2], added[1::2], strict=True):
        raw[name.removeprefix("--")] = int(value)
    (tmp_path / path.parent.name).mkdir()
    rescaled = tmp_path / path.parent.name / path.name
    rescaled.write_text(yaml.safe_dump(raw))
    header = read_header(path)
    _, args, _ = parse_recipe(rescaled)
    return header, batch_arithmetic(rescaled, args, processes=processes, train_prompts=header.get("train_prompts"))


@pytest.mark.parametrize("recipe", ["configs/erpo/qwen2.5-math-7b.yaml", "configs/dph/qwen2.5-math-7b.yaml",
                                    "configs/eepo/qwen2.5-3b.yaml", "configs/apo/qwen2.5-7B.yaml"])
@pytest.mark.usefixtures("bf16_anywhere")
def test_the_rescaled_batch_gives_the_recipes_header_numbers_on_16_processes(recipe, tmp_path):
    """The flags the launcher adds, applied to the recipe, give the numbers its header states for 8 processes."""

    result = dry_run(recipe)
    assert result.returncode == 0, result.stderr
    argv = node_commands(result.stdout)[1][1]
    added = argv[argv.index("--config") + 2:]
    assert added, "16 processes need other batch flags than the recipe's 8"
    path = ROOT / recipe
    header, numbers = rescaled_numbers(path, added, 16, tmp_path)
    for key, value in numbers.items():
        assert header[key] == value, f"{recipe} on 16 processes with {added}: {key} {value} != {header[key]}"
    _, original, _ = parse_recipe(path)
    assert batch_arithmetic(path, original, processes=16, train_prompts=header.get("train_prompts")) != numbers


def test_a_reserved_vllm_node_serves_and_the_trainers_use_server_mode():
    result = dry_run("configs/apo/qwen2.5-7B.yaml", nodes="gpu-a,gpu-b,gpu-c", VLLM_NODES="1", VLLM_TP="2")
    assert result.returncode == 0, result.stderr
    serve = next(line for line in result.stdout.splitlines() if line.startswith("vllm: "))
    serve = shlex.split(serve[len("vllm: "):].rstrip("&"))
    assert serve[:4] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu-c"]
    assert serve[4:6] == ["trl", "vllm-serve"]
    assert flag(serve, "--model") == "Qwen/Qwen2.5-7B" and flag(serve, "--tensor_parallel_size") == "2"
    commands = node_commands(result.stdout)
    assert sorted(commands) == [0, 1]  # gpu-c trains nothing
    argv = commands[1][1]
    assert flag(argv, "--num_processes") == "16" and flag(argv, "--main_process_ip") == "gpu-a"
    assert flag(argv, "--vllm_mode") == "server" and flag(argv, "--vllm_server_host") == "gpu-c"
    assert flag(argv, "--vllm_server_port") == "8000"


def test_refusals_name_the_problem_before_anything_starts():
    three = dry_run("configs/apo/qwen2.5-7B.yaml", nodes="gpu-a,gpu-b,gpu-c")  # 24 processes: no whole division
    assert three.returncode != 0 and "written for 8 processes" in three.stderr and "batch flags" in three.stderr
    assert "node 0" not in three.stdout
    own = dry_run("configs/apo/qwen2.5-7B.yaml", "--gradient_accumulation_steps", "1", nodes="gpu-a,gpu-b,gpu-c")
    assert own.returncode == 0 and "your batch flags decide the batch" in own.stdout
    two_servers = dry_run("configs/apo/qwen2.5-7B.yaml", nodes="a,b,c", VLLM_NODES="2")
    assert two_servers.returncode != 0 and "one vLLM server" in two_servers.stderr
    missing = dry_run("configs/apo/nope.yaml")
    assert missing.returncode != 0 and "not found" in missing.stderr
    no_slurm = dry_run("configs/apo/qwen2.5-7B.yaml", nodes="")
    assert no_slurm.returncode != 0 and "SLURM_JOB_NODELIST" in no_slurm.stderr


def test_a_placeholder_hub_id_stops_the_job_before_srun_and_the_dry_run_says_so(tmp_path):
    """The paper recipes push to the placeholder ``your-org/...``: every process refused it after the allocation
    started (and a vLLM server with it); the script stops before srun, and a dry run says that it would."""
    recipe, eight = "configs/erpo/qwen2.5-math-7b.yaml", {"GPUS_PER_NODE": "4"}  # 8 processes: no rescaling to import
    said = dry_run(recipe, **eight)
    assert said.returncode == 0 and "a real job would stop here: push_to_hub: true with the placeholder" in said.stderr
    assert "--hub_model_id <you>/" in said.stderr
    for fix in (["--push_to_hub=false"], ["--hub-model-id", "me/erpo-7b"]):
        assert "would stop" not in dry_run(recipe, *fix, **eight).stderr
    bare = dry_run(recipe, "--push_to_hub=false", "--push_to_hub", "--seed", "3", **eight)
    assert "would stop here: push_to_hub: true with the placeholder" in bare.stderr  # a bare flag is true
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    real = subprocess.run(["bash", str(SCRIPT), recipe], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env=dict(environment, SLURM_JOB_NODELIST="gpu-a,gpu-b", SLURM_GPUS_ON_NODE="4",
                                   PYTHON=sys.executable, TRL_VARIANTS_ROOT=str(ROOT), PATH=str(tmp_path)
                                   + ":" + environment["PATH"]))
    assert real.returncode != 0 and "slurm_train.sh: push_to_hub: true with the placeholder" in real.stderr
    assert "trl-variants:" not in real.stdout  # stopped before printing the launch, let alone running srun


def test_a_copy_of_a_recipe_outside_a_method_folder_names_its_method_with_method(tmp_path):
    copy = tmp_path / "mine.yaml"
    copy.write_text((ROOT / "configs" / "erpo" / "qwen2.5-math-7b.yaml").read_text())
    unnamed = dry_run(str(copy))
    assert unnamed.returncode != 0 and "set METHOD=<erpo|eepo|dph|apo>" in unnamed.stderr
    named = dry_run(str(copy), METHOD="erpo", GPUS_PER_NODE="4")  # 8 processes, as written: nothing to rescale
    assert named.returncode == 0 and "examples/train_erpo.py" in named.stdout


def test_node_ranges_are_expanded_by_scontrol(tmp_path):
    """A real allocation names its nodes as ranges (``gpu[01-02]``); the launcher expands them with scontrol."""
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[01-02]" ] && printf "gpu01\\ngpu02\\n"\n')
    fake.chmod(0o755)
    result = dry_run("configs/erpo/qwen2.5-math-7b.yaml", nodes="gpu[01-02]",
                     path=f"{tmp_path}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    assert {rank: host for rank, (host, _) in node_commands(result.stdout).items()} == {0: "gpu01", 1: "gpu02"}
    unexpanded = dry_run("configs/erpo/qwen2.5-math-7b.yaml", nodes="gpu[01-02]", path="/usr/bin:/bin")
    assert unexpanded.returncode != 0 and "scontrol" in unexpanded.stderr


@pytest.mark.parametrize("recipe", ["configs/erpo/qwen2.5-math-7b.yaml", "configs/dph/qwen2.5-math-7b.yaml",
                                    "configs/eepo/qwen2.5-3b.yaml", "configs/apo/qwen2.5-7B.yaml"])
@pytest.mark.usefixtures("bf16_anywhere")
def test_fewer_processes_than_the_recipe_keep_its_batch_with_the_trainers_own_arithmetic(recipe, tmp_path):
    """2 nodes x 2 GPUs (4 processes) on a recipe written for 8: the launcher adds what the trainer itself would
    (``recipe_batch``), which gives the header's numbers (it used to refuse: it only divided)."""
    import yaml

    from trl_variants.registry import method_classes
    from trl_variants.training.batch import recipe_batch

    result = dry_run(recipe, GPUS_PER_NODE="2")
    assert result.returncode == 0, result.stderr
    assert "launching 4" in result.stdout
    argv = node_commands(result.stdout)[1][1]
    added = argv[argv.index("--config") + 2:]
    path = ROOT / recipe
    own, _ = recipe_batch(path, [], 4, method_classes(path.parent.name)[1])
    assert added == own and "--gradient_accumulation_steps" in added
    raw = yaml.safe_load(path.read_text())
    for name, value in zip(added[::2], added[1::2], strict=True):
        assert int(value) == 2 * raw[name.removeprefix("--")]  # the per-device memory as written
    header, numbers = rescaled_numbers(path, added, 4, tmp_path)
    for key, value in numbers.items():
        assert header[key] == value, f"{recipe} on 4 processes with {added}: {key} {value} != {header[key]}"


@pytest.mark.slow
def test_slurm_train_launches_two_nodes_for_real_and_they_train_as_one_node_with_two_processes(tmp_path):
    """``scripts/slurm_train.sh`` run for real, not dry: 2 nodes x 1 process (``fake_slurm/srun`` starts both node
    tasks on this machine, each with its own ``SLURM_PROCID``, in one rendezvous) train the ERPO paper recipe's smoke
    command bit for bit as ``accelerate launch`` of 2 processes on one node does, and the run's last line is printed
    once, by the process that saved (``accelerator.print`` printed it on the second node's first process too, before
    the model was saved). ``scripts/check_multinode.py`` runs every paper recipe and backend this way."""
    import torch
    from safetensors.torch import load_file

    from trainers_tests.examples.test_recipe_start import cpu_smoke_argv
    from trainers_tests.helpers import script_finished

    bin_dir = Path(sys.executable).parent
    path = ROOT / "configs" / "erpo" / "qwen2.5-math-7b.yaml"
    (tmp_path / "erpo").mkdir()
    argv = cpu_smoke_argv(path, tmp_path / "erpo")  # the recipe copy in a folder named after its method
    recipe = argv[argv.index("--config") + 1]
    argv = argv[:argv.index("--config")] + argv[argv.index("--config") + 2:] + [
        "--max_steps", "2", "--torch_threads", "1", "--seed", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONWARNINGS="ignore",
               TRL_VARIANTS_CACHE=str(tmp_path / "cache"))
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    two = subprocess.run(
        ["bash", str(SCRIPT), recipe, *argv, "--output_dir", str(tmp_path / "two")], cwd=ROOT, capture_output=True,
        text=True, timeout=600, env=dict(
            env, PATH=f"{ROOT / 'trainers_tests' / 'distributed' / 'fake_slurm'}:{bin_dir}:{env['PATH']}",
            SLURM_JOB_NODELIST="127.0.0.1,localhost", GPUS_PER_NODE="1", MAIN_PROCESS_PORT="29571",
            PYTHON=sys.executable, ACCELERATE_CONFIG="configs/accelerate/multi_cpu.yaml",
            FAKE_SRUN_NODE_LOCAL="TRL_VARIANTS_CACHE"))
    assert script_finished(two), two.stdout[-2000:] + two.stderr[-3000:]
    assert "on 2 node(s) x 1 = 2 processes" in two.stdout
    assert two.stdout.count("model saved to") == 1 and "(trained on 2 process(es))" in two.stdout
    one = subprocess.run(
        [str(bin_dir / "accelerate"), "launch", "--config_file", "configs/accelerate/multi_cpu.yaml",
         "--num_processes", "2", "--main_process_port", "29572", "examples/train_erpo.py", "--config", recipe, *argv,
         "--output_dir", str(tmp_path / "one")], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert script_finished(one), one.stdout[-2000:] + one.stderr[-3000:]
    start = load_file(str(Path(argv[argv.index("--model_name_or_path") + 1]) / "model.safetensors"))
    a, b = (load_file(str(tmp_path / run / "model.safetensors")) for run in ("one", "two"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a)  # the 2 steps trained
