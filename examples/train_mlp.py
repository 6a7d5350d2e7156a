#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A small deterministic MLP on synthetic data, trained with Regroup's trainer library.

    # the reference: one plain process, no Regroup
    python3 examples/train_mlp.py --steps 40 --float64 --out /tmp/ref.pt

    # under the control plane: a manager and one agent per node (here 2 nodes x 2 ranks), all
    # reading the job's credential from $REGROUP_CREDENTIAL_FILE
    export REGROUP_CREDENTIAL_FILE=$(mktemp) && openssl rand -hex 24 >"$REGROUP_CREDENTIAL_FILE"
    regroup-manager --job-id mlp --nodes 2 --nproc-per-node 2 --listen 127.0.0.1:9601 \
        --record "$(mktemp -d)/record.json" --label fault-scheduling=force --annotation recover-strategy=retry,recover-in-place,elastic-training
    regroup-agent --manager 127.0.0.1:9601 --job-id mlp --nnodes 2 --nproc-per-node 2 \
        --node-rank 0 --master-addr 127.0.0.1 --python python3 examples/train_mlp.py --steps 40 --float64
    regroup-agent ... --node-rank 1 ...

The model is x -> Linear -> BatchNorm -> ReLU -> dropout -> Linear, so the step contract's
buffers (batch-norm statistics) and random numbers (dropout, from the micro-batch's seed) are
exercised. ``--tp 2`` splits it over two ranks (tensor parallel, Megatron style: the first layer
by output features, the second by input features, one all-reduce in the forward pass, written
with ``regroup.all_reduce``: torch's all-reduce that an abort can interrupt), so a data-parallel
replica is two ranks. Without an agent and with one
process the full model is computed, whatever ``--tp`` says: that is the reference the
tensor-parallel runs must match.
``--optimizer-sharding zero1`` shards the optimizer's state over the data-parallel ranks
(regroup.zero, a distributed optimizer; ``--optimizer-copies 2`` keeps a second copy of every
slice): the reference is the same plain process.

Each step prints ``step= loss= world= dp= generation=`` (from every replica's first rank). With
``--ledger FILE`` each replica's first rank appends, before voting, one JSON line per step:
``{"g": [epoch, generation], "step": s, "replica": r, "mb": {j: [samples]}}``; the committed
micro-batches of a step are those of the highest generation that has lines for it. With
``--out FILE`` the final parameters are written (full layout, torch.save of a dict).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import regroup  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--steps", type=int, default=40, help="total steps")
    p.add_argument("--dataset", type=int, default=256, help="samples in the synthetic dataset")
    p.add_argument("--micro-batch", type=int, default=8, help="samples per micro-batch")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (all replicas)")
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--outputs", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--float64", action="store_true", help="train in float64 (exactness tests)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=None, help="default: 0.05 for SGD, 0.01 for Adam")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per replica (1 or 2)")
    p.add_argument("--ddp", action="store_true", help="use the DistributedDataParallel wrapper")
    p.add_argument("--shard", choices=("none", "hsdp"), default="none",
                   help="hsdp: the full model sharded with FSDP2 over each replica's --tp ranks, "
                        "replicated across replicas (torch >= 2.6); each rank computes its part "
                        "of every micro-batch of its replica")
    p.add_argument("--optimizer-sharding", choices=("none", "zero1"), default="none",
                   help="zero1: a distributed optimizer, its state sharded over the data-parallel ranks")
    p.add_argument("--optimizer-copies", type=int, default=1,
                   help="with zero1: 2 keeps a second copy of each slice (a lost rank's comes back in place)")
    p.add_argument("--checksum-interval", type=int, default=10)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-interval", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    p.add_argument("--scaled-in-sleep", type=float, default=0.0, metavar="S",
                   help="tests: S seconds of extra work per step while the generation has fewer "
                        "replicas than this process has seen, so that a replacement has time to start")
    p.add_argument("--ledger", default=None, help="append the committed (step, sample) pairs here")
    p.add_argument("--out", default=None, help="write the final parameters here")
    p.add_argument("--abort-exit", type=float, default=10.0, help="Timeouts.abort_exit")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--verbose", action="store_true", help="log the library's events (INFO) to stderr")
    p.add_argument("--poison-step", type=int, default=None, metavar="S",
                   help="tests: micro-batch 0 of step S holds a poison sample: the process computing it "
                        "raises every time (a data bug, not a fault of the machine)")
    p.add_argument("--hold-sync", default=None, metavar="DIR",
                   help="tests: a rank sending its state to a new rank (after step 0) first writes "
                        "DIR/held.PID and waits (up to 120 s) for DIR/release, so that a test can "
                        "inject a fault while a state sync is in flight")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Data and model
# ---------------------------------------------------------------------------------------------


def make_data(args: argparse.Namespace, dtype: torch.dtype):
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.dataset, args.features, generator=g, dtype=dtype)
    a = torch.randn(args.features, args.hidden, generator=g, dtype=dtype) / args.features ** 0.5
    b = torch.randn(args.hidden, args.outputs, generator=g, dtype=dtype) / args.hidden ** 0.5
    y = torch.tanh(x @ a) @ b + 0.01 * torch.randn(args.dataset, args.outputs, generator=g, dtype=dtype)
    return x, y


class AllReduceSum(torch.autograd.Function):
    """Sum over the tensor-parallel group in the forward pass; the identity backward."""

    @staticmethod
    def forward(ctx, tensor, group):  # noqa: D401
        out = tensor.clone()
        regroup.all_reduce(out, op=dist.ReduceOp.SUM, group=group)  # an abort frees it at once
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ShardedMLP(torch.nn.Module):
    """The MLP, or shard ``tp_rank`` of ``tp`` of it. Every shard is cut from the same full
    initialisation, so the shards together equal the full model."""

    def __init__(self, args: argparse.Namespace, dtype: torch.dtype, tp: int, tp_rank: int):
        super().__init__()
        if args.hidden % tp:
            raise SystemExit(f"--hidden {args.hidden} is not divisible by --tp {tp}")
        self.tp, self.tp_rank, self.p = tp, tp_rank, args.dropout
        self.hidden = args.hidden
        g = torch.Generator().manual_seed(args.seed)
        full1 = torch.nn.Linear(args.features, args.hidden, dtype=dtype)
        full2 = torch.nn.Linear(args.hidden, args.outputs, dtype=dtype)
        with torch.no_grad():
            for t in (full1.weight, full1.bias, full2.weight, full2.bias):
                t.copy_((torch.rand(t.shape, generator=g, dtype=dtype) * 2 - 1) / t.shape[-1] ** 0.5)
        part = args.hidden // tp
        cut = slice(tp_rank * part, (tp_rank + 1) * part)
        self.w1 = torch.nn.Parameter(full1.weight[cut].detach().clone())
        self.b1 = torch.nn.Parameter(full1.bias[cut].detach().clone())
        self.bn = torch.nn.BatchNorm1d(part, dtype=dtype)
        self.w2 = torch.nn.Parameter(full2.weight[:, cut].detach().clone())
        self.b2 = torch.nn.Parameter(full2.bias.detach().clone())  # replicated over the shards
        self.cut = cut

    def forward(self, x: torch.Tensor, group=None) -> torch.Tensor:
        h = torch.nn.functional.linear(x, self.w1, self.b1)
        h = torch.relu(self.bn(h))
        if self.training and self.p > 0:
            # The mask of the full hidden layer, then this shard's columns: the same numbers
            # whatever the tensor-parallel size.
            keep = torch.rand(x.shape[0], self.hidden, dtype=x.dtype) >= self.p
            h = h * keep[:, self.cut].to(x.dtype) / (1 - self.p)
        out = torch.nn.functional.linear(h, self.w2)
        if self.tp > 1:
            out = AllReduceSum.apply(out, group)
        return out + self.b2


def merge_shards(shards) -> dict:
    """The full model's parameters from the shards' (in tensor-parallel order)."""
    return {
        "w1": torch.cat([s["w1"] for s in shards], 0),
        "b1": torch.cat([s["b1"] for s in shards], 0),
        "bn.weight": torch.cat([s["bn.weight"] for s in shards], 0),
        "bn.bias": torch.cat([s["bn.bias"] for s in shards], 0),
        "w2": torch.cat([s["w2"] for s in shards], 1),
        "b2": shards[0]["b2"],
    }


def parameters_of(model: torch.nn.Module) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def save_atomic(obj, path: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def gather_shard_files(out: str, count: int, timeout: float = 60) -> list:
    """The ``count`` files ``OUT.pN`` that a replica's positions saved (waited for, bounded), loaded."""
    names = [f"{out}.p{p}" for p in range(count)]
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(n) for n in names):
        if time.monotonic() > deadline:
            raise SystemExit(f"the other shards of {out} did not appear within {timeout:.0f} s")
        time.sleep(0.05)
    return [torch.load(n) for n in names]


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


class ExtraState(dict):
    """The script's extra state (a dict). With ``--hold-sync`` its ``state_dict``, which the
    library calls while serialising the state for a new rank, holds the sender (see --help)."""

    hold_dir = None

    def state_dict(self) -> dict:
        d = self.hold_dir
        if d and int(self["last_committed"]) >= 0 and not os.path.exists(os.path.join(d, "release")):
            marker = os.path.join(d, f"held.{os.getpid()}")
            with open(marker + ".tmp", "w") as f:
                f.write(os.environ.get("RANK", ""))
            os.replace(marker + ".tmp", marker)
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(d, "release")) and time.monotonic() < deadline:
                time.sleep(0.02)
        return dict(self)

    def load_state_dict(self, state: dict) -> None:
        self.clear()
        self.update(state)


def setup_process(args) -> tuple:
    """Logging, threads and the run's shape: (dtype, managed by an agent, world size)."""
    if args.verbose:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format=f"%(asctime)s {os.environ.get('RANK', '0')}:%(process)d %(message)s")
    torch.set_num_threads(1)
    dtype = torch.float64 if args.float64 else torch.float32
    return dtype, bool(os.environ.get("REGROUP_AGENT_SOCKET")), int(os.environ.get("WORLD_SIZE", "1"))


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype, managed, world = setup_process(args)
    tp = args.tp if (managed or world > 1) else 1
    tp_rank = int(os.environ.get("RANK", "0")) % tp  # the manager numbers replicas' ranks in order

    x, y = make_data(args, dtype)
    hsdp = args.shard == "hsdp"
    model = ShardedMLP(args, dtype, 1, 0) if hsdp else ShardedMLP(args, dtype, tp, tp_rank)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr or 0.05, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr or 0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=15, gamma=0.5)
    extra = ExtraState(last_committed=torch.tensor(-1))
    ExtraState.hold_dir = args.hold_sync

    config = regroup.TrainerConfig(
        dataset_size=args.dataset, micro_batch_size=args.micro_batch,
        microbatches_per_step=args.microbatches, seed=args.seed, tensor_parallel=tp,
        checksum_interval=args.checksum_interval, checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval=args.checkpoint_interval, ddp=args.ddp, sharding="hsdp" if hsdp else None,
        optimizer_sharding=None if args.optimizer_sharding == "none" else args.optimizer_sharding,
        optimizer_copies=args.optimizer_copies,
        timeouts=regroup.Timeouts(abort_exit=args.abort_exit))

    def on_commit(step: regroup.Step) -> None:
        extra["last_committed"] = torch.tensor(step.number)

    trainer = regroup.Trainer(model, opt, sched, config=config, extra_state=extra, on_commit=on_commit)
    ledger = os.open(args.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.ledger else None

    most_dp = 0
    for step in trainer.steps(args.steps):
        g = step.generation
        most_dp = max(most_dp, g.dp)
        loss_sum, samples, lines = 0.0, 0, {}
        with step:
            for mb in step.microbatches():
                if step.number == args.poison_step and mb.index == 0:
                    raise RuntimeError(f"poison sample {int(mb.indices[0])} in micro-batch 0 of step {step.number}")
                with mb:  # the micro-batch's RNG (dropout); DDP's no_sync but for the last
                    out = step.model(x[mb.indices], group=g.tp_group)
                    loss = ((out - y[mb.indices]) ** 2).sum()  # summed per sample: the contract
                    step.backward(loss)
                loss_sum += loss.item()
                samples += mb.indices.numel()
                lines[mb.index] = mb.indices.tolist()
            if args.step_sleep:
                if args.verbose:
                    print(f"step={step.number} sleeping {args.step_sleep} s", file=sys.stderr, flush=True)
                time.sleep(args.step_sleep)
            if args.scaled_in_sleep and g.dp < most_dp:
                time.sleep(args.scaled_in_sleep)
            step.reduce_gradients()
            if ledger is not None and (g.tp_rank == 0 or hsdp):
                record = {"g": [g.epoch, g.number], "step": step.number, "replica": g.replica, "mb": lines}
                if hsdp:  # each rank computed its part of the micro-batches
                    record["part"] = g.tp_rank
                os.write(ledger, (json.dumps(record) + "\n").encode())
            trainer.commit(step)
        if step.committed and g.tp_rank == 0 and not args.quiet:
            print(f"step={step.number} loss={loss_sum / max(samples, 1):.6f} world={g.world_size} "
                  f"dp={g.dp} generation={g.number} rank={g.rank}", flush=True)

    if args.out:
        g = trainer.generation
        params = parameters_of(trainer.module)
        if hsdp and g is not None:  # each rank's local shards (dim 0), joined in position order
            params = {name: p.to_local().clone() for name, p in params.items()}
        if g is None or g.world_size == 1 or (g.replica == 0 and g.tp == 1):
            if g is None or g.rank == 0:
                save_atomic(params, args.out)
        elif g.replica == 0:
            save_atomic(params, f"{args.out}.tp{g.tp_rank}")
            if g.tp_rank == 0:
                deadline = time.monotonic() + 60
                names = [f"{args.out}.tp{t}" for t in range(g.tp)]
                while not all(os.path.exists(n) for n in names):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the other shards of {args.out} did not appear within 60 s")
                    time.sleep(0.05)
                shards = [torch.load(n) for n in names]
                save_atomic({k: torch.cat([s[k] for s in shards], 0) for k in shards[0]} if hsdp
                            else merge_shards(shards), args.out)
    if ledger is not None:
        os.close(ledger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
