# SPDX-License-Identifier: Apache-2.0
"""The Megatron-core adapter: flags and sizes from the script's arguments, and parallel_state's
groups rebuilt on every generation, equal to Regroup's grid, before and after a scale-in.

What runs here (CPU, gloo): the argument handling, megatron-core 0.16's
``parallel_state.initialize_model_parallel`` on 8 then 4 ranks, a tiny GPTModel built on the
rebuilt groups (its layers split by stage, its linear layers by tensor-parallel rank), and
examples/train_megatron_gpt.py's tiny GPT trained at dp 2 x tp 2, and at dp 2 x pp 2 through
Megatron-core's own pipeline schedule, under a real manager and agents through a killed rank
(``regroup.megatron.on_cpu``: forward and backward through ``get_forward_backward_func()``).
What does not: sequence parallelism on a CPU (its buffers are made on CUDA), Megatron-LM's
``pretrain()`` loop and MindSpeed's; NCCL.
"""

import json
import os
import re
import sys
import threading

if __name__ == "__main__":  # a worker: this folder's megatron.py must not shadow megatron-core
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

import pytest  # noqa: E402

from regroup.api import ConfigError  # noqa: E402
from regroup.group import Layout  # noqa: E402
from regroup.megatron import Adapter, activate, deactivate, enabled, optimizer_copies, parse_sizes  # noqa: E402
from regroup.testing import free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    from megatron.core import parallel_state
    MEGATRON = parallel_state is not None
except Exception:  # noqa: BLE001 - ImportError, or a megatron that needs a newer torch
    MEGATRON = False
needs_megatron = pytest.mark.skipif(
    not MEGATRON, reason="megatron-core is not importable here (scripts/torch2 installs it in the torch 2.x venv)")

SEED_ARGS = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size=2",
             "--num-layers", "4", "--enable-high-availability", "--enable-elastic-training"]


def test_sizes_and_flags_come_from_the_scripts_own_arguments():
    assert parse_sizes(SEED_ARGS) == (2, 2)
    assert parse_sizes(["--num-layers", "4"]) == (1, 1)
    assert enabled(SEED_ARGS) and not enabled(["--tensor-model-parallel-size", "2"])
    assert activate(["--tensor-model-parallel-size", "2"]) is None  # no seed flag: nothing changes
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size 'two' is not a whole number"):
        parse_sizes(["--tensor-model-parallel-size", "two"])
    with pytest.raises(ConfigError, match="--context-parallel-size 2: the Regroup adapter rebuilds"):
        parse_sizes(["--context-parallel-size", "2"])
    # Megatron's distributed optimizer is Regroup's ZeRO-1; high availability keeps a second copy
    assert optimizer_copies(SEED_ARGS) == 0
    assert optimizer_copies(["--enable-elastic-training", "--use-distributed-optimizer"]) == 1
    assert optimizer_copies([*SEED_ARGS, "--use-distributed-optimizer"]) == 2


@pytest.mark.skipif(MEGATRON, reason="megatron-core is importable here")
def test_the_seed_flags_without_megatron_core_are_refused_saying_so():
    with pytest.raises(ConfigError, match="megatron.core cannot be imported"):
        activate(["--enable-elastic-training"])


def test_a_job_disagreeing_with_the_script_is_refused_naming_both():
    adapter = Adapter(2, 2)
    adapter.check(2, 2)
    with pytest.raises(ConfigError, match=r"regroup.io/tensor-parallel=4 and regroup.io/pipeline-parallel=1 "
                                          r"but the script has --tensor-model-parallel-size 2 and "
                                          r"--pipeline-model-parallel-size 2"):
        adapter.check(4, 1)
    config = adapter.config(dataset_size=64, micro_batch_size=2, microbatches_per_step=4)
    assert (config.tensor_parallel, config.pipeline_parallel, config.replica_size) == (2, 2, 4)
    with pytest.raises(ConfigError, match="comes from the script's Megatron arguments"):
        adapter.config(dataset_size=64, micro_batch_size=2, microbatches_per_step=4, tensor_parallel=4)
    assert config.optimizer_sharding is None
    zero = Adapter(2, 1, optimizer_copies=2).config(dataset_size=64, micro_batch_size=2, microbatches_per_step=4)
    assert (zero.optimizer_sharding, zero.optimizer_copies) == ("zero1", 2)
    with pytest.raises(ConfigError, match=r"optimizer_copies comes from the script's Megatron arguments "
                                          r"\(--use-distributed-optimizer, and --enable-high-availability"):
        Adapter(2, 1, optimizer_copies=1).config(dataset_size=64, micro_batch_size=2, microbatches_per_step=4,
                                                 optimizer_copies=2)


@needs_megatron
def test_a_single_process_trainer_under_the_seed_flags_has_parallel_state_while_it_trains(monkeypatch):
    import torch
    from megatron.core import parallel_state as ps

    import regroup

    for name in ("WORLD_SIZE", "RANK", "REGROUP_AGENT_SOCKET"):
        monkeypatch.delenv(name, raising=False)
    adapter = activate(["--enable-elastic-training", "--tensor-model-parallel-size", "1"])
    try:
        model = torch.nn.Linear(2, 1)
        trainer = regroup.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                  config=adapter.config(dataset_size=8, micro_batch_size=2,
                                                        microbatches_per_step=2, backend="gloo"))
        seen = []
        for step in trainer.steps(2):
            with step:
                seen.append(ps.model_parallel_is_initialized() and ps.get_data_parallel_world_size())
                # Megatron's own all-reduce (torch's) on its tensor-parallel group, through the
                # wrapper that leaves it on an abort (regroup.abort)
                ones = torch.ones(3)
                assert torch.distributed.all_reduce(ones, group=ps.get_tensor_model_parallel_group()) is None
                assert torch.equal(ones, torch.ones(3))
                for mb in step.microbatches():
                    step.backward(model(torch.ones(len(mb.indices), 2)).sum())
                trainer.commit(step)
        trainer.close()
        assert seen == [1, 1] and adapter.generations == 1
        assert not ps.model_parallel_is_initialized()  # torn down with the generation
        assert all(hasattr(getattr(torch.distributed, name), "regroup_original")
                   for name in ("all_reduce", "batch_isend_irecv"))
    finally:
        deactivate()
    assert not any(hasattr(getattr(torch.distributed, name), "regroup_original")   # torch's own again
                   for name in ("all_reduce", "batch_isend_irecv"))


@needs_megatron
def test_on_cpu_refuses_sequence_parallelism_and_moves_the_pipeline_schedules_device_inside_its_block():
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    from regroup.megatron import on_cpu

    def config(**kwargs):
        return TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4,
                                 use_cpu_initialization=True, pipeline_dtype=torch.float32, **kwargs)

    with pytest.raises(ConfigError, match="sequence parallelism allocates its buffers on CUDA"):
        on_cpu(config(tensor_model_parallel_size=2, sequence_parallel=True), 4, 16)
    cpu = on_cpu(config(tensor_model_parallel_size=2), 4, 16)  # parallel_state not built: kept for later
    assert (cpu.attention_elements, cpu.dtype) == (4 * 2 * 16 * 16, torch.float32)
    # the pipeline schedule's device and synchronize, inside the block only (nested alike)
    device, sync = torch.cuda.current_device, torch.cuda.synchronize
    with cpu:
        with cpu:
            assert torch.cuda.current_device() == 0 and torch.cuda.synchronize() is None
            assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert torch.cuda.current_device() == 0
    assert (torch.cuda.current_device, torch.cuda.synchronize) == (device, sync)


@needs_megatron
def test_rebind_swaps_every_group_a_module_holds_and_names_one_it_cannot_place():
    import dataclasses

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from regroup.megatron import ORDER, _collection, rebind

    def build():
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=2, order=ORDER, create_gloo_process_groups=False)
        return _collection()

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        old = build()
        held = build()  # a collection of the model's own, as Megatron-core's layers keep
        model = torch.nn.Sequential(torch.nn.Linear(1, 1))
        model[0].tp_group, model.groups, model.pg_collection = held.tp, (held.tp, held.dp, 3), held
        new = build()
        in_collection = sum(isinstance(getattr(held, f.name, None), dist.ProcessGroup)
                            for f in dataclasses.fields(held))
        assert in_collection >= 4  # tp, pp, mp, dp and what initialize_model_parallel derives
        assert rebind(model, held, new) == 1 + 2 + in_collection
        assert model[0].tp_group is new.tp and model.groups == (new.tp, new.dp, 3)
        assert model.pg_collection.tp is new.tp and model.pg_collection.dp is new.dp
        assert rebind(model, held, new) == 0  # already the new ones
        model[0].stray = old.tp  # a group of an earlier build that the adapter does not hold
        with pytest.raises(ConfigError, match=r"^regroup.megatron: 0.stray holds a process group that "
                                              r"parallel_state did not make"):
            rebind(model, held, new)
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def _tiny_gpt(ps) -> dict:
    """A tiny GPT built with this generation's parallel_state (CPU initialisation): its layers
    split by stage and its linear layers by tensor-parallel rank. Only built: pp 2's schedule
    needs CUDA (regroup.megatron.on_cpu); the tiny GPT test below trains one at pp 1."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=4, hidden_size=32, ffn_hidden_size=128, num_attention_heads=4,
                               tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                               use_cpu_initialization=True, params_dtype=torch.float32,
                               pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=64,
                     max_sequence_length=16, pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage())
    return {"layers": len(model.decoder.layers),
            "fc1": list(model.decoder.layers[0].mlp.linear_fc1.weight.shape),
            "embedding": hasattr(model, "embedding"), "output": hasattr(model, "output_layer")}


def _worker(rank: int, directory: str) -> None:
    import time

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from regroup.abort import GroupSockets
    from regroup.group import build_groups

    adapter = activate(SEED_ARGS)
    side = dist.FileStore(os.path.join(directory, "side"), 8)
    out = {}
    for generation, world in ((1, 8), (2, 4)):
        if rank >= world:
            break  # this rank's node was lost: the scale-in leaves it out
        if rank == 0:
            side.set(f"port{generation}", str(free_port()))
        port = int(side.get(f"port{generation}"))
        sockets = GroupSockets(port)
        layout = Layout.grid(world, rank, 2, 2)
        groups = build_groups(store_host="127.0.0.1", store_port=port, layout=layout, backend="gloo",
                              rendezvous_s=60, collective_s=60, aborted=threading.Event(), sockets=sockets)
        assert groups.extra["megatron"] is ps
        got = {
            "tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
            "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
            "dp": dist.get_process_group_ranks(ps.get_data_parallel_group()),
            "mp": dist.get_process_group_ranks(ps.get_model_parallel_group()),
            "ranks": [ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(),
                      ps.get_data_parallel_rank()],
            "regroup": {k: dist.get_process_group_ranks(getattr(groups, f"{k}_group"))
                        for k in ("tp", "pp", "mp") if getattr(groups, f"{k}_group") is not None},
        }
        if generation == 2:
            got["gpt"] = _tiny_gpt(ps)
        got["expected"] = {k: layout.mine(k) for k in ("tp", "pp", "dp", "mp")}
        got["expected"]["ranks"] = [layout.tp_rank, layout.stage, layout.replica]
        out[generation] = got
        dist.barrier()
        sockets.shutdown(include_store=True)  # the abort
        groups.destroy()
        out[generation]["after_destroy"] = ps.model_parallel_is_initialized()
        side.add(f"done{generation}", 1)
        while int(side.add(f"done{generation}", 0)) < world:
            time.sleep(0.005)
    out["generations"] = adapter.generations
    deactivate()
    with open(os.path.join(directory, f"mc{rank}.json"), "w") as f:
        json.dump(out, f)


@needs_megatron
def test_parallel_state_is_rebuilt_per_generation_and_equals_the_grid_after_a_scale_in(tmp_path, procs):
    from regroup.grid_test import run_workers

    run_workers(procs, tmp_path, 8, script=__file__)
    for r in range(8):
        result = json.loads((tmp_path / f"mc{r}.json").read_text())
        assert result["generations"] == (2 if r < 4 else 1)
        for generation in (["1", "2"] if r < 4 else ["1"]):
            got = result[generation]
            for kind in ("tp", "pp", "dp", "mp", "ranks"):
                assert got[kind] == got["expected"][kind], (r, generation, kind, got)
            for kind, ranks in got["regroup"].items():
                assert ranks == got[kind], (r, generation, kind, got)  # parallel_state's are Regroup's
            assert got["after_destroy"] is False
    # After the scale-in to 4 ranks (dp 1), rank 3 is stage 1, tp rank 1, alone in its dp group.
    assert json.loads((tmp_path / "mc3.json").read_text())["2"]["dp"] == [3]
    # The tiny GPT of generation 2: 2 of its 4 layers a stage, fc1's 128 rows halved by tp 2, the
    # embedding on stage 0 (ranks 0, 1), the output layer on stage 1 (ranks 2, 3).
    for r in range(4):
        gpt = json.loads((tmp_path / f"mc{r}.json").read_text())["2"]["gpt"]
        assert gpt == {"layers": 2, "fc1": [64, 32], "embedding": r < 2, "output": r >= 2}, (r, gpt)


GPT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "train_megatron_gpt.py")
GPT_DATA = {"dataset": 64, "micro_batch": 4, "microbatches": 4, "seed": 1234}
GPT_ARGS = ["--float64", "--dataset", "64", "--micro-batch-size", "4", "--global-batch-size", "16",
            "--checksum-interval", "4", "--quiet"]
GPT_STEPS = 16
GPT_ANNOTATIONS = [
    "recover-strategy=retry,recover-in-place,recover,elastic-training,dump,exit",
    # 25 s, under the hang timeout's floor (30 s): the manager counts a trainer's silence from
    # its start, and importing torch and megatron-core takes seconds.
    "regroup.io/heartbeat-interval-ms=250",
    "regroup.io/liveness-misses=100",
    "regroup.io/global-batch-size=16",
    "regroup.io/micro-batch-size=4",
    "regroup.io/checksum-interval=4",
]


def _plain_gpt(procs, tmp_path, reference, pp: int):
    """The plain Megatron-core run (no Regroup): one process, or ``pp`` in torchrun's environment."""
    from regroup.testing import PYTHON

    argv = [PYTHON, GPT, *GPT_ARGS, "--train-iters", str(GPT_STEPS), "--out", str(reference),
            "--pipeline-model-parallel-size", str(pp)]
    port = free_port()
    return [procs.start(argv, {"OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                               "WORLD_SIZE": str(pp), "RANK": str(r), "LOCAL_RANK": str(r)},
                        log=tmp_path / f"reference{r}.log") for r in range(pp)]


@needs_megatron
@pytest.mark.e2e
@pytest.mark.parametrize("tp,pp,flags", [(2, 1, []), (1, 2, []),
                                         (2, 1, ["--use-distributed-optimizer", "--enable-high-availability"])],
                         ids=["dp2-tp2", "dp2-pp2", "dp2-tp2-distributed-optimizer"])
def test_a_tiny_megatron_gpt_recovers_a_killed_rank_and_equals_the_fault_free_run(tmp_path, procs, binaries,
                                                                                  tp, pp, flags):
    """examples/train_megatron_gpt.py under a real manager and two agents (2 nodes x 2 ranks: a
    replica of tp 2, or of 2 pipeline stages run by Megatron-core's own pipeline schedule, within
    a node; dp 2 across them), float64, one rank SIGKILLed at step 4: it is restarted in place
    while the other replica goes on alone, its three peers keep their processes, the restarted
    process builds its model (in the provisional world), receives the state and its replica
    rejoins (dp 2 again), and the final weights equal the plain Megatron-core run's (no Regroup:
    the script without the seed's flags, in one process, or in two for the pipeline), every
    micro-batch of every step committed once. With Megatron's distributed optimizer and high
    availability (Regroup's ZeRO-1 with a second copy of each slice), the killed rank's slice
    comes from its copy on the other replica, and the plain run holds the optimizer whole."""
    import signal

    import torch

    from regroup.e2e_test import Cluster
    from regroup.testing import check_ledger, read_ledger, relative_error, wait_for

    reference = tmp_path / "reference.pt"  # run beside the cluster's start (both import megatron-core)
    plain = _plain_gpt(procs, tmp_path, reference, pp)
    c = Cluster(tmp_path, procs, binaries, steps=GPT_STEPS, train=[], tp=tp, script=GPT,
                annotations=[*GPT_ANNOTATIONS, f"regroup.io/pipeline-parallel={pp}"], join_window_s=240)
    c.train = ["--enable-elastic-training", *flags, "--tensor-model-parallel-size", str(tp),
               "--pipeline-model-parallel-size", str(pp), *GPT_ARGS,
               "--train-iters", str(GPT_STEPS), "--step-sleep", "0.2", "--scaled-in-sleep", "1.5",
               "--ledger", str(c.ledger),
               "--out", str(c.out), "--verbose"]
    c.start()
    c.wait_step(4, timeout=300)
    survivors = c.trainers("node0") + c.trainers("node1")[:1]
    victim = c.trainers("node1")[1]
    os.kill(victim, signal.SIGKILL)

    def rejoined() -> bool:  # a step of both replicas in a generation after the fault's
        return any(r["g"][1] > 2 and r["replica"] == 1 for r in read_ledger(c.ledger)) or c.dead()

    wait_for(rejoined, 240, "the restarted rank's replica to rejoin")
    assert not c.dead(), c.logs()
    now = c.trainers("node0") + c.trainers("node1")
    assert all(pid in now for pid in survivors), f"a survivor was restarted: {survivors} -> {now}\n{c.logs()}"
    assert victim not in now
    for name in ("node0", "node1"):
        assert c.agents[name].wait(timeout=300) == 0, f"agent {name}\n{c.status()}\n{c.logs()}"
    status = c.status()
    assert "restart_in_place" in status, status
    # Every generation's groups were rebound into the model's modules (regroup.megatron): the
    # survivors' in three generations, the restarted process's in its first.
    node0, node1 = (tmp_path / "node0.log").read_text(), (tmp_path / "node1.log").read_text()
    assert node0.count("this process's build 3)") == 2, c.logs()
    if tp == 2:
        assert node0.count("model's process groups rebound (42 references; this process's build 3)") == 2, c.logs()
    assert "received the state of step" in node1.split("killed by signal 9")[-1], c.logs()
    if flags:
        # Alone at dp 1, replica 0's rank at the killed rank's position cut its whole state from
        # its own slice and the second copy of the lost one; back at dp 2, the restarted rank
        # received its slices from it.
        at1 = "at position 1 (pipeline stage 0, tensor-parallel rank 1)"
        assert f"ZeRO-1 optimizer slices [0] {at1} of dp 1 assembled from dp 2 (0 bytes received)" in node0, c.logs()
        restarted = re.search(rf"ZeRO-1 optimizer slices \[1, 0\] {re.escape(at1)} of dp 2 assembled from dp 1 "
                              r"\((\d+) bytes received\)", node1.split("killed by signal 9")[-1])
        assert restarted and int(restarted.group(1)) > 0, c.logs()
    for r, p in enumerate(plain):
        assert p.wait(timeout=120) == 0, (tmp_path / f"reference{r}.log").read_text()[-3000:]
    error = relative_error(torch.load(reference), torch.load(c.out))
    assert error <= 1e-9, f"norm-relative error {error:.3e}\n{status}"
    check_ledger(c.ledger, GPT_STEPS, **GPT_DATA, shuffle=False)


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2])
