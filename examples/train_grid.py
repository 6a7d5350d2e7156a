#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A deterministic MLP trained on a dp x tp x pp grid with Regroup (torch 2.x for pp > 1).

    # the reference: one plain process computes the whole model
    python3 examples/train_grid.py --steps 40 --float64 --out /tmp/ref.pt
    # under the control plane (regroup.io/tensor-parallel: 2, regroup.io/pipeline-parallel: 2)
    regroup-agent ... python3 examples/train_grid.py --tp 2 --pp 2 --steps 40 --float64

The model is ``x -> Linear -> blocks -> Linear`` where each block is Megatron's MLP with a
residual, ``h + W2 tanh(W1 h + b1) + b2``. ``--pp`` splits the blocks over pipeline stages (the
first stage also holds the input layer, the last the output layer), run by a
``torch.distributed.pipelining`` schedule that ``regroup.pipeline.Pipeline`` rebuilds on every
generation's pipeline group; ``--tp`` splits every block over the tensor-parallel group (W1 by
rows, W2 by columns: an all-reduce of the block's output in the forward pass and of its input's
gradient in the backward pass). ``--tp-impl hand`` (the default) splits the parameters by hand
and runs those all-reduces itself (``regroup.all_reduce``); ``--tp-impl dtensor`` builds the
blocks of ``nn.Linear`` layers, whole, and hands the trainer a ``parallelize_module`` plan (W1
``ColwiseParallel``, W2 ``RowwiseParallel``): the trainer parallelizes them with DTensor over
each generation's tensor-parallel group and re-homes them on the next generation's
(``regroup.tensor_parallel``; torch 2.x). There is no dropout and no
batch-norm: the schedule runs the micro-batches itself. Without an agent and with one process
the whole model is computed, whatever ``--tp`` and ``--pp`` say: the reference the grid must
match.

The flags and outputs are those of ``examples/train_mlp.py`` (``--ledger``, ``--out``,
``--step-sleep``, ...; not ``--ddp``, ``--dropout``, ``--poison-step``, ``--hold-sync``) plus
``--pp``, ``--ffn``, ``--blocks``, ``--schedule`` and ``--tp-impl``; the ledger is written by each replica's rank at position 0 (stage 0,
tensor-parallel rank 0). ``--optimizer-sharding zero1`` (either ``--tp-impl``) shards each
position's optimizer state over the ranks at that position in every replica (regroup.zero).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import regroup  # noqa: E402
import train_mlp  # noqa: E402
from regroup.state import local_tensor  # noqa: E402
from train_mlp import gather_shard_files, make_data, save_atomic  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    """This script's own flags, then train_mlp.py's (the data, the optimizer, the ledger...)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1], add_help=False,
                                allow_abbrev=False)  # --tp is train_mlp.py's, not --tp-impl
    p.add_argument("--pp", type=int, default=1, help="pipeline stages per replica")
    p.add_argument("--ffn", type=int, default=32, help="the blocks' inner width (split by --tp)")
    p.add_argument("--blocks", type=int, default=4, help="blocks (split by --pp)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    p.add_argument("--tp-impl", choices=("hand", "dtensor"), default="hand",
                   help="split the blocks over --tp by hand, or with DTensor (parallelize_module)")
    own, rest = p.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        p.print_help()
        print("\nand the flags of train_mlp.py, but --ddp, --dropout, --poison-step, --hold-sync:")
    args = train_mlp.parse_args(rest)
    for flag, unused in (("--ddp", args.ddp), ("--poison-step", args.poison_step is not None),
                         ("--hold-sync", args.hold_sync is not None)):
        if unused:
            raise SystemExit(f"train_grid.py does not take {flag}")
    vars(args).update(vars(own))
    args.hidden = 16 if "--hidden" not in rest else args.hidden  # the blocks' width
    return args


class CopyToTP(torch.autograd.Function):
    """Identity forward; the gradient summed over the tensor-parallel group (Megatron's f)."""

    @staticmethod
    def forward(ctx, tensor, group):  # noqa: D401
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        regroup.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """The sum over the tensor-parallel group; identity backward (Megatron's g)."""

    @staticmethod
    def forward(ctx, tensor, group):  # noqa: D401
        out = tensor.clone()
        regroup.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def full_parameters(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    """The whole model's initial parameters, by name, drawn in one fixed order."""
    g = torch.Generator().manual_seed(args.seed)

    def draw(*shape):
        return (torch.rand(shape, generator=g, dtype=dtype) * 2 - 1) / shape[-1] ** 0.5

    p = {"inp_w": draw(args.hidden, args.features), "inp_b": draw(args.hidden)}
    for i in range(args.blocks):
        p[f"b{i}_w1"] = draw(args.ffn, args.hidden)
        p[f"b{i}_b1"] = draw(args.ffn)
        p[f"b{i}_w2"] = draw(args.hidden, args.ffn)
        p[f"b{i}_b2"] = draw(args.hidden)
    p["head_w"] = draw(args.outputs, args.hidden)
    p["head_b"] = draw(args.outputs)
    return p


# How a tensor-parallel shard cuts each kind of parameter: dim 0, dim 1, or replicated (None).
CUT = {"w1": 0, "b1": 0, "w2": 1}


def cut_of(name: str):
    return CUT.get(name.split("_")[-1]) if name.startswith("b") and name[1].isdigit() else None


class GridStage(torch.nn.Module):
    """Stage ``stage`` of ``pp`` and tensor-parallel shard ``tp_rank`` of ``tp`` of the model."""

    def __init__(self, args: argparse.Namespace, dtype: torch.dtype, tp: int, tp_rank: int,
                 pp: int, stage: int):
        super().__init__()
        if args.ffn % tp or args.blocks % pp:
            raise SystemExit(f"--ffn {args.ffn} must divide by --tp {tp} and --blocks {args.blocks} by --pp {pp}")
        per = args.blocks // pp
        self.blocks = list(range(stage * per, (stage + 1) * per))
        self.first, self.last = stage == 0, stage == pp - 1
        self.tp = tp
        self.tp_group = None  # the generation's, set before each step
        full = full_parameters(args, dtype)
        names = [f"b{i}_{k}" for i in self.blocks for k in ("w1", "b1", "w2", "b2")]
        names = (["inp_w", "inp_b"] if self.first else []) + names + (["head_w", "head_b"] if self.last else [])
        for name in names:
            t, dim = full[name], cut_of(name)
            if dim is not None:
                part = t.shape[dim] // tp
                t = t.narrow(dim, tp_rank * part, part)
            self.register_parameter(name, torch.nn.Parameter(t.detach().clone()))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        P = dict(self.named_parameters())
        if self.first:
            h = torch.nn.functional.linear(h, P["inp_w"], P["inp_b"])
        for i in self.blocks:
            a = CopyToTP.apply(h, self.tp_group) if self.tp > 1 else h
            z = torch.tanh(torch.nn.functional.linear(a, P[f"b{i}_w1"], P[f"b{i}_b1"]))
            o = torch.nn.functional.linear(z, P[f"b{i}_w2"])
            if self.tp > 1:
                o = ReduceFromTP.apply(o, self.tp_group)
            h = h + o + P[f"b{i}_b2"]
        if self.last:
            h = torch.nn.functional.linear(h, P["head_w"], P["head_b"])
        return h


class Block(torch.nn.Module):
    """One block as ``nn.Linear`` layers: ``h + W2 tanh(W1 h + b1) + b2``."""

    def __init__(self, hidden: int, ffn: int, dtype: torch.dtype):
        super().__init__()
        self.w1 = torch.nn.Linear(hidden, ffn, dtype=dtype, device="meta")
        self.w2 = torch.nn.Linear(ffn, hidden, dtype=dtype, device="meta")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.w2(torch.tanh(self.w1(h)))


class DTensorStage(torch.nn.Module):
    """Stage ``stage`` of ``pp`` of the model, whole (``--tp-impl dtensor``): the trainer splits
    its blocks over the tensor-parallel group with :func:`dtensor_plan`."""

    def __init__(self, args: argparse.Namespace, dtype: torch.dtype, pp: int, stage: int):
        super().__init__()
        if args.blocks % pp:
            raise SystemExit(f"--blocks {args.blocks} must divide by --pp {pp}")
        per = args.blocks // pp
        self.first, self.last = stage == 0, stage == pp - 1
        if self.first:
            self.inp = torch.nn.Linear(args.features, args.hidden, dtype=dtype, device="meta")
        self.blocks = torch.nn.ModuleDict({f"b{i}": Block(args.hidden, args.ffn, dtype)
                                           for i in range(stage * per, (stage + 1) * per)})
        if self.last:
            self.head = torch.nn.Linear(args.hidden, args.outputs, dtype=dtype, device="meta")
        self.to_empty(device="cpu")
        full = full_parameters(args, dtype)
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(full[hand_name(name)])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.first:
            h = self.inp(h)
        for block in self.blocks.values():
            h = block(h)
        return self.head(h) if self.last else h


def dtensor_plan(model: DTensorStage) -> dict:
    """Every block's W1 split by rows (``ColwiseParallel``), W2 by columns (``RowwiseParallel``):
    the hand split's cut, with the same all-reduces."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for key in model.blocks:
        plan[f"blocks.{key}.w1"] = ColwiseParallel()
        plan[f"blocks.{key}.w2"] = RowwiseParallel()
    return plan


def hand_name(name: str) -> str:
    """A DTensorStage parameter's name in full_parameters: blocks.b3.w1.bias -> b3_b1."""
    parts = name.split(".")
    if parts[0] == "blocks":
        _, block, layer, kind = parts
        return f"{block}_{kind[0]}{layer[1:]}"
    return f"{parts[0]}_{parts[1][0]}"


def merge(shards: dict, tp: int) -> dict:
    """The whole model's parameters from replica 0's shards ({(stage, tp_rank): params})."""
    out = {}
    for (stage, tp_rank), params in sorted(shards.items()):
        for name, t in params.items():
            dim = cut_of(name)
            if dim is None:
                out.setdefault(name, t)
            elif tp_rank == 0:
                out[name] = torch.cat([shards[(stage, r)][name] for r in range(tp)], dim)
    return out


def sum_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).sum()  # summed per sample: the step contract


def main(argv=None) -> int:
    args = parse_args(argv)
    dtype, managed, world = train_mlp.setup_process(args)
    grid = managed or world > 1
    tp, pp = (args.tp, args.pp) if grid else (1, 1)
    # The manager numbers a replica's ranks tp fastest, then stages (regroup.group).
    position = int(os.environ.get("RANK", "0")) % (tp * pp)
    tp_rank, stage = position % tp, position // tp

    x, y = make_data(argparse.Namespace(seed=args.seed, dataset=args.dataset, features=args.features,
                                        hidden=args.ffn, outputs=args.outputs), dtype)
    dtensor = args.tp_impl == "dtensor"
    plan = None
    if dtensor:
        if args.ffn % tp:
            raise SystemExit(f"--ffn {args.ffn} must divide by --tp {tp}")
        model = DTensorStage(args, dtype, pp, stage)
        plan = dtensor_plan(model) if tp > 1 else None
    else:
        model = GridStage(args, dtype, tp, tp_rank, pp, stage)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr or 0.02, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr or 0.01)
    config = regroup.TrainerConfig(
        dataset_size=args.dataset, micro_batch_size=args.micro_batch,
        microbatches_per_step=args.microbatches, seed=args.seed, tensor_parallel=tp,
        pipeline_parallel=pp, checksum_interval=args.checksum_interval,
        checkpoint_dir=args.checkpoint_dir, checkpoint_interval=args.checkpoint_interval,
        timeouts=regroup.Timeouts(abort_exit=args.abort_exit), tensor_parallel_plan=plan,
        optimizer_sharding=None if args.optimizer_sharding == "none" else args.optimizer_sharding,
        optimizer_copies=args.optimizer_copies)
    trainer = regroup.Trainer(model, opt, config=config)
    pipe = None
    if pp > 1:
        from regroup.pipeline import Pipeline
        example_in = x[:1] if model.first else torch.zeros(1, args.hidden, dtype=dtype)
        example_out = torch.zeros(1, args.outputs if model.last else args.hidden, dtype=dtype)
        # With DTensor the trainer rebuilds the module every generation: the schedule follows it.
        pipe = Pipeline(None if dtensor else model, sum_loss, example_in, example_out, schedule=args.schedule)
    ledger = os.open(args.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.ledger else None

    most_dp = 0
    for step in trainer.steps(args.steps):
        g = step.generation
        if not dtensor:
            model.tp_group = g.tp_group
        most_dp = max(most_dp, g.dp)
        loss_sum, lines = 0.0, {}
        with step:
            mbs = list(step.microbatches())
            for mb in mbs:
                lines[mb.index] = mb.indices.tolist()
            if pipe is not None:
                idx = torch.cat([mb.indices for mb in mbs]) if mbs else torch.empty(0, dtype=torch.long)
                loss = pipe.run(step, x[idx], y[idx])
                loss_sum = 0.0 if loss is None else float(loss)
            else:
                for mb in mbs:
                    with mb:
                        loss = sum_loss(step.model(x[mb.indices]), y[mb.indices])
                        step.backward(loss)
                    loss_sum += loss.item()
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if args.scaled_in_sleep and g.dp < most_dp:
                time.sleep(args.scaled_in_sleep)
            step.reduce_gradients()
            if ledger is not None and g.tp_rank == 0:
                record = {"g": [g.epoch, g.number], "step": step.number, "replica": g.replica, "mb": lines}
                os.write(ledger, (json.dumps(record) + "\n").encode())
            trainer.commit(step)
        if step.committed and model.last and tp_rank == 0 and not args.quiet:
            print(f"step={step.number} loss={loss_sum / max(1, args.micro_batch * len(lines)):.6f} "
                  f"world={g.world_size} dp={g.dp} generation={g.number} rank={g.rank}", flush=True)

    if args.out:
        g = trainer.generation
        # With DTensor: each rank's local shard, named as the hand split names its parameters.
        params = {hand_name(name) if dtensor else name: local_tensor(p).detach().clone()
                  for name, p in trainer.module.named_parameters()}
        if g is None or g.world_size == 1:
            save_atomic(params, args.out)
        elif g.replica == 0:
            save_atomic({"stage": stage, "tp_rank": tp_rank, "params": params}, f"{args.out}.p{position}")
            if position == 0:
                parts = gather_shard_files(args.out, tp * pp)
                save_atomic(merge({(p["stage"], p["tp_rank"]): p["params"] for p in parts}, tp), args.out)
    if ledger is not None:
        os.close(ledger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
