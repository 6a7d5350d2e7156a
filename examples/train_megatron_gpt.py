#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A tiny Megatron-core GPT on synthetic tokens, on the CPU; under Regroup with the seed's flags.

    # without the seed's flags: plain Megatron-core, one process (or torchrun's environment)
    python examples/train_megatron_gpt.py --train-iters 8 --float64 --out /tmp/ref.pt
    # under the control plane (regroup.io/tensor-parallel: 2): the same script with the seed's flags
    regroup-agent ... --python python examples/train_megatron_gpt.py --enable-elastic-training \\
        --tensor-model-parallel-size 2 --train-iters 8 --float64 --ledger /tmp/ledger

The model is megatron-core's ``GPTModel`` with the local layer spec (``get_gpt_layer_local_spec``:
no Transformer Engine, no Apex, no fused kernels), ``use_cpu_initialization=True`` (every rank
draws the full weights from torch's CPU generator and keeps its tensor-parallel shard: the same
numbers whatever the layout) and no dropout. Each step runs Megatron-core's own
``get_forward_backward_func()`` over the micro-batches (with ``--pipeline-model-parallel-size
2``, its pipeline schedule: the stages hold untied embeddings and draw their initial weights
apart, so a pipelined run equals a plain run of the same stages, not a one-process one); the loss is the cross entropy of every
next token, computed here in the parameters' dtype from the logits gathered over the
tensor-parallel group (:class:`GatherLogits`): Megatron-core's vocab-parallel cross entropy casts
the logits to float32, which a float64 exactness test cannot have, and its own gather
(``parallel_output=False``) allocates on CUDA (``_gather_along_last_dim``). The sequences are arithmetic progressions
modulo the vocabulary (a start and a stride per sequence), so the loss falls.

With ``--enable-elastic-training`` or ``--enable-high-availability`` the script adopts Regroup:
``regroup.megatron.activate()`` reads the parallel sizes from the script's own arguments,
``adapter.model(...)`` builds the model for this rank's place in its replica and rebinds its
process groups in every generation, and ``regroup.Trainer`` runs the steps (a step is the same
global batch, split over the replicas that are left after a fault). ``main()`` holds both: the
15 lines marked ``# regroup`` come in, and the plain branch's set-up of torch.distributed and
parallel_state (6 lines) and its loop's sample split, gradient all-reduce and optimizer step
(12 lines) go out: the trainer does those. ``regroup.megatron.on_cpu`` is needed by both: it is
what lets Megatron-core 0.16.1 run without CUDA (python/README.md, "Megatron-core").

With ``--ledger FILE`` each replica's first rank appends, before voting, one JSON line per step
(``{"g": [epoch, generation], "step": s, "replica": r, "mb": {j: [samples]}}``, as
examples/train_mlp.py). With ``--out FILE`` the final parameters of the whole model are written
(the tensor-parallel shards joined; torch.save of a dict by name).
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
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import regroup  # noqa: E402
import regroup.megatron  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.pipeline_parallel import get_forward_backward_func  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from train_mlp import gather_shard_files, save_atomic  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--enable-elastic-training", action="store_true", help="the seed's flag: adopt Regroup")
    p.add_argument("--enable-high-availability", action="store_true", help="the seed's flag: adopt Regroup")
    p.add_argument("--use-distributed-optimizer", action="store_true",
                   help="the optimizer's state sharded over the data-parallel ranks (under Regroup: "
                        "its ZeRO-1; plain, one process holds it whole, which is the same arithmetic)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--num-attention-heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=64)
    p.add_argument("--seq-length", type=int, default=16)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--train-iters", type=int, default=8)
    p.add_argument("--dataset", type=int, default=64, help="sequences in the synthetic dataset")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    p.add_argument("--float64", action="store_true", help="float64 parameters (exactness tests)")
    p.add_argument("--checksum-interval", type=int, default=4)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    p.add_argument("--scaled-in-sleep", type=float, default=0.0, metavar="S",
                   help="tests: S seconds of extra work per step while the generation has fewer "
                        "replicas than this process has seen, so that a replacement has time to start")
    p.add_argument("--abort-exit", type=float, default=10.0, help="Timeouts.abort_exit")
    p.add_argument("--ledger", default=None, help="append each step's micro-batches here")
    p.add_argument("--out", default=None, help="write the final parameters here")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--verbose", action="store_true", help="log the library's events (INFO) to stderr")
    args = p.parse_args(argv)
    if args.global_batch_size % args.micro_batch_size:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} is not a multiple of "
                         f"--micro-batch-size {args.micro_batch_size}")
    args.microbatches = args.global_batch_size // args.micro_batch_size
    return args


def make_tokens(args: argparse.Namespace) -> torch.Tensor:
    """``dataset`` sequences of ``seq_length + 1`` tokens: each an arithmetic progression modulo
    the vocabulary, from its own start and stride."""
    g = torch.Generator().manual_seed(args.seed + 1)
    start = torch.randint(args.vocab_size, (args.dataset, 1), generator=g)
    stride = torch.randint(1, 8, (args.dataset, 1), generator=g)
    return (start + stride * torch.arange(args.seq_length + 1)) % args.vocab_size


def gpt_config(args: argparse.Namespace, dtype: torch.dtype) -> TransformerConfig:
    return TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=4 * args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        hidden_dropout=0.0, attention_dropout=0.0,
        calculate_per_token_loss=True)  # the loss is a sum: no division by the micro-batches


def model_provider(config: TransformerConfig, args: argparse.Namespace) -> GPTModel:
    # .to(): the local spec's layer norms (torch's LayerNorm) are made in float32 whatever
    # params_dtype says; torch's CPU layer norm refuses mixed dtypes.
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                    vocab_size=args.vocab_size, max_sequence_length=args.seq_length,
                    pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                    share_embeddings_and_output_weights=args.pipeline_model_parallel_size == 1
                    ).to(config.params_dtype)


class GatherLogits(torch.autograd.Function):
    """The vocab-parallel logits gathered over the tensor-parallel group; backward: this rank's
    slice of the gradient (every rank computes the same loss from the same whole logits)."""

    @staticmethod
    def forward(ctx, logits):  # noqa: D401
        ctx.rank, ctx.size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        parts = [torch.empty_like(logits) for _ in range(ctx.size)]
        dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.size, -1)[ctx.rank].contiguous()


def forward_backward(model, tokens: torch.Tensor, microbatches, args, cpu) -> float:
    """Megatron-core's forward-backward function over ``microbatches`` (lists of sample
    indices); returns the summed loss (on the last pipeline stage; 0 elsewhere)."""
    s = args.seq_length
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)[None, None]  # True: hidden

    def forward_step(data_iterator, model):
        batch = tokens[next(data_iterator)]
        inputs, labels = batch[:, :-1], batch[:, 1:]
        logits = model(inputs, torch.arange(s).expand_as(inputs), mask)

        def loss_func(logits):
            if ps.get_tensor_model_parallel_world_size() > 1:
                logits = GatherLogits.apply(logits)
            # Summed over the sequences, a mean over each one's tokens (the step contract).
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), reduction="sum") / s
            return loss, torch.tensor(len(inputs)), {"loss": loss.detach()}

        return logits, loss_func

    with cpu:
        out = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(microbatches), model=model,
            num_microbatches=len(microbatches), seq_length=s, micro_batch_size=args.micro_batch_size)
    return sum(float(o["loss"]) for o in out)


def shard_of(model, offset: int) -> dict:
    """This rank's parameters by their name in the whole model, with their tensor-parallel cut."""
    out = {}
    for name, p in model.named_parameters():
        parts = name.split(".")
        if parts[:2] == ["decoder", "layers"]:
            parts[2] = str(int(parts[2]) + offset)
        dim = p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
        out[".".join(parts)] = (p.detach().clone(), dim)
    return out


def save_params(model, args, out: str, position: int) -> None:
    """The whole model's parameters in ``out``: every rank of the first replica writes its shard
    and the replica's first rank joins them."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    offset = position // tp * (args.num_layers // pp)
    if tp * pp == 1:
        save_atomic({k: t for k, (t, _) in shard_of(model, offset).items()}, out)
        return
    save_atomic({"tp_rank": position % tp, "params": shard_of(model, offset)}, f"{out}.p{position}")
    if position:
        return
    shards = sorted(gather_shard_files(out, tp * pp), key=lambda s: s["tp_rank"])
    whole = {}
    for name in {n for s in shards for n in s["params"]}:
        held = [s["params"][name] for s in shards if name in s["params"]]
        t, dim = held[0]
        whole[name] = t if dim is None else torch.cat([h[0] for h in held], dim)
    save_atomic(whole, out)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verbose:
        import logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dtype = torch.float64 if args.float64 else torch.float32
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    tokens = make_tokens(args)
    torch.manual_seed(args.seed)  # every rank draws the whole model's initial weights alike
    config = gpt_config(args, dtype)
    adapter = regroup.megatron.activate()  # regroup: None without the seed's flags
    if adapter is None:
        # Plain Megatron-core: one process, or torchrun's environment.
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        model = model_provider(config, args)
        position = ps.get_pipeline_model_parallel_rank() * tp + ps.get_tensor_model_parallel_rank()
    else:
        model = adapter.model(lambda: model_provider(config, args))  # regroup
        position = adapter.position()  # regroup
    last = position // tp == pp - 1 and position % tp == 0  # prints the loss
    cpu = regroup.megatron.on_cpu(config, args.micro_batch_size, args.seq_length)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ledger = os.open(args.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if args.ledger else None
    G, M, mb = args.global_batch_size, args.microbatches, args.micro_batch_size

    def note(g, replica, step, lines):  # the ledger, by each replica's first rank
        if ledger is not None and position == 0:
            record = {"g": g, "step": step, "replica": replica, "mb": lines}
            os.write(ledger, (json.dumps(record) + "\n").encode())

    if adapter is None:
        dp, replica = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        begin, count = replica * M // dp, (replica + 1) * M // dp - replica * M // dp
        per_epoch = args.dataset // G
        for step in range(args.train_iters):
            first = (step % per_epoch) * G
            mbs = {j: list(range(first + j * mb, first + (j + 1) * mb)) for j in range(begin, begin + count)}
            opt.zero_grad()
            loss = forward_backward(model, tokens, list(mbs.values()), args, cpu)
            for p in model.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if dp > 1:
                    dist.all_reduce(p.grad, group=ps.get_data_parallel_group())
                p.grad /= G
            note([0, 1], replica, step, mbs)
            opt.step()
            if not args.quiet and last:
                print(f"step={step} loss={loss / (mb * count):.6f} dp={dp}", flush=True)
        done = replica == 0
    else:
        trainer = regroup.Trainer(model, opt, config=adapter.config(  # regroup
            dataset_size=args.dataset, micro_batch_size=mb, microbatches_per_step=M,  # regroup
            seed=args.seed, shuffle=False, checksum_interval=args.checksum_interval,  # regroup
            timeouts=regroup.Timeouts(abort_exit=args.abort_exit)))  # regroup
        most_dp, g = 0, None
        for step in trainer.steps(args.train_iters):  # regroup
            g = step.generation  # regroup
            most_dp = max(most_dp, g.dp)
            with step:  # regroup
                mbs = {m.index: m.indices.tolist() for m in step.microbatches()}  # regroup
                loss = forward_backward(step.model, tokens, list(mbs.values()), args, cpu) if mbs else 0.0
                step.reduce_gradients()  # regroup
                time.sleep(args.step_sleep + (args.scaled_in_sleep if g.dp < most_dp else 0))
                note([g.epoch, g.number], g.replica, step.number, mbs)
                trainer.commit(step)  # regroup
            if step.committed and not args.quiet and last:
                print(f"step={step.number} loss={loss / (mb * max(1, len(mbs))):.6f} dp={g.dp} "
                      f"generation={g.number} rank={g.rank}", flush=True)
        done = g is not None and g.replica == 0  # regroup: the last step's replica
    if args.out and done:
        save_params(model, args, args.out, position)
    if ledger is not None:
        os.close(ledger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
