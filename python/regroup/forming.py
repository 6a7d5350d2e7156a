# SPDX-License-Identifier: Apache-2.0
"""Forming a generation: from a StartGeneration to a rank that can run the generation's steps.

:func:`enter` does it in order: settle this rank's vote (a step it voted for and applied may
have been committed after the abort, or must be undone), check that it is not ahead of the generation, build the process
groups on the generation's own store, sync the state (regroup.sync), then build the
DistributedDataParallel wrapper if the script uses one. A failure leaves the rank outside the
generation, waiting for the next one (reported to the agent unless an abort explains it).
Without an agent, :func:`enter_standalone` makes the one generation of the run from torchrun's
environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from regroup import contract
from regroup._proto import wire_pb2 as pb
from regroup.abort import GroupSockets, PeerWatch
from regroup.api import (AgentConnectionError, CheckpointError, ConfigError, StateLost, StateSyncError,
                         TrainerConfig)
from regroup.group import Layout, ProcessGroups, build_groups, run_builders
from regroup.step import Generation
from regroup.sync import sync_state

if TYPE_CHECKING:
    from regroup.trainer import Trainer

log = logging.getLogger("regroup")


def enter_standalone(t: Trainer) -> None:
    """Without an agent: the run's one generation, from torchrun's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT; a single process without them).

    Raises:
        StateSyncError: the generation could not be formed.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    start = pb.StartGeneration(directive_id=0)
    plan = start.plan
    plan.epoch, plan.generation, plan.world_size = 0, 1, world
    replica_size = t.config.replica_size
    plan.tensor_parallel, plan.pipeline_parallel = t.config.tensor_parallel, t.config.pipeline_parallel or 1
    plan.data_parallel = world // replica_size if world % replica_size == 0 else 0
    plan.store_host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    plan.store_port = int(os.environ.get("MASTER_PORT", "29500"))
    plan.committed_step = t.committed_step
    start.assignment.rank = rank
    start.assignment.replica = rank // replica_size
    enter(t, start)
    if t.generation is None:
        raise StateSyncError("the process group could not be formed (see the log)")


def plan_layout(config: TrainerConfig, start: Any) -> Tuple[Layout, int, int]:
    """This rank's place in the generation: its layout and its replica's micro-batches
    ``[begin, begin + count)``.

    Raises:
        ConfigError: the job and the script disagree on the sizes.
    """
    plan, a = start.plan, start.assignment
    tp, pp = max(1, plan.tensor_parallel), max(1, plan.pipeline_parallel)
    if config.pipeline_parallel is None:
        # tensor_parallel is the whole replica, one tensor-parallel group (its meaning before
        # pipeline_parallel existed): the plan's split is not the script's concern.
        if tp * pp != config.tensor_parallel:
            raise ConfigError(f"generation {plan.generation} has replicas of {tp * pp} ranks "
                              f"(tensor {tp} x pipeline {pp}) but the script has "
                              f"tensor_parallel={config.tensor_parallel}: give the job and the "
                              "script the same sizes")
        layout = Layout(plan.world_size, a.rank, tp * pp)
    else:
        if (tp, pp) != (config.tensor_parallel, config.pipeline_parallel):
            raise ConfigError(f"generation {plan.generation} has tensor parallel {tp} x pipeline "
                              f"parallel {pp} (regroup.io/tensor-parallel, pipeline-parallel) but "
                              f"the script has tensor_parallel={config.tensor_parallel} x "
                              f"pipeline_parallel={config.pipeline_parallel}: give the job and the "
                              "script the same sizes")
        layout = Layout.grid(plan.world_size, a.rank, tp, pp)
    M = config.microbatches_per_step
    if plan.microbatches_per_step:
        if plan.microbatches_per_step != M:
            raise ConfigError(f"the job has {plan.microbatches_per_step} micro-batches per step "
                              f"(regroup.io/global-batch-size / micro-batch-size) but the script has "
                              f"{M}: make them equal")
        begin, count = a.microbatch_begin, a.microbatch_count
        if begin + count > M:
            raise ConfigError(f"generation {plan.generation} gives replica {a.replica} micro-batches "
                              f"[{begin}, {begin + count}) of {M}")
    else:
        begin, count = contract.replica_range(M, layout.dp, layout.replica)
    if (config.ddp or config.sharding) and count == 0:
        raise ConfigError(f"replica {layout.replica} has no micro-batch in a step ({M} micro-batches "
                          f"over {layout.dp} replicas): the DDP wrapper and sharding need at least one")
    return layout, begin, count


def settle_vote(t: Trainer, plan: Any, layout: Layout, begin: int, count: int) -> None:
    """The step this rank voted for (and applied, or not when it waited for the outcome) before
    the abort, its outcome unheard: kept (applied now if it was not) when the new generation
    resumes after it (it was committed after all), else undone (its start put back) before this
    rank can serve or checkpoint state."""
    voted = t.voted
    if voted is None:
        return
    t.voted = None
    # The step may have been committed by a generation this rank was not in (it was lost, or a
    # standby, when that one ran): its own vote reduced the gradients in another order, so it is
    # dropped and the state comes from a peer. (0, 0): the plan does not know (an older manager).
    committed_by = (plan.committed_epoch, plan.committed_generation)
    own_vote = committed_by == (0, 0) or committed_by == voted.mark
    if plan.committed_step == voted.step == t.committed_step + 1 and own_vote:
        t.heard_commit_step = max(t.heard_commit_step, voted.step)
        if not voted.applied:   # its outcome was waited for: applied now, from its gradients
            assert voted.done is not None
            t.apply(voted.done)
        t.finalize_vote(voted, None, checkpoint=False)
        log.info("regroup: step %d, %s, was committed after the abort", voted.step,
                 "applied when voted" if voted.applied else "voted and applied now")
    else:
        t.restore_voted(voted)
    t.state.zero_grad()


def enter(t: Trainer, start: Any) -> None:
    """Forms a generation: groups, state sync, the DDP wrapper. On failure, stays out of it."""
    plan = start.plan
    mark = (plan.epoch, plan.generation)
    layout, begin, count = plan_layout(t.config, start)
    settle_vote(t, plan, layout, begin, count)
    if plan.committed_step < t.committed_step:
        detail = (f"generation {plan.generation} resumes after step {plan.committed_step}, but this "
                  f"rank holds step {t.committed_step}"
                  + (f" (checkpoint {t.resume_from.path})" if t.resume_from else "")
                  + ": it needs a generation formed with its state")
        log.error("regroup: %s", detail)
        if t.managed and t.link is not None:
            t.link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, plan.generation, plan.committed_step + 1, detail)
            return
        raise StateSyncError(detail)
    t.busy = True
    t.report_phase(pb.PHASE_SYNCING, plan.committed_step + 1)
    started = time.monotonic()
    sockets = GroupSockets(plan.store_port)
    t.membership.begin(mark, sockets)
    aborted_event = _AbortFlag(t)
    groups: Optional[ProcessGroups] = None
    try:
        if not t.managed and layout.world_size == 1:
            groups = single_process_groups(layout, t.backend)
        else:
            groups = build_groups(store_host=plan.store_host, store_port=plan.store_port,
                                  layout=layout, backend=t.backend,
                                  rendezvous_s=t.config.timeouts.rendezvous,
                                  collective_s=t.config.timeouts.collective,
                                  aborted=aborted_event, sockets=sockets,
                                  on_missing=_missing_reporter(t, plan.generation) if t.managed else None)
        t.membership.formed(groups)
        if t.membership.aborted():
            raise RuntimeError("aborted while forming the groups")
        t.state.regroup(groups)  # a sharded state (regroup.sharded) reshards on the new groups
        sync_state(t, plan, layout, groups)
        if t.config.ddp:
            t.membership.ddp = build_ddp(t.state.model, groups, t.config.global_batch_size)
        else:
            t.membership.ddp = t.state.live_model()
    except (RuntimeError, StateSyncError, CheckpointError) as e:
        aborted = t.membership.aborted()
        if isinstance(e, CheckpointError) or (not t.managed):
            t.busy = False
            t.leave()
            raise
        if not aborted:
            time.sleep(0)  # an abort may be on its way; report if none within the grace
            deadline = time.monotonic() + t.config.timeouts.abort_grace
            while time.monotonic() < deadline and not t.membership.aborted():
                time.sleep(0.005)
        if not t.membership.aborted():
            detail = f"rank {layout.rank} could not form generation {plan.generation}: {e}"
            log.warning("regroup: %s", detail)
            # Part of the state held by no rank goes to the checkpoint (state_lost). Either way the
            # fault names no step: none ran, and two failures to form at one point of the training
            # (a store host still leaving its previous generation, twice) are no poison step.
            kind = pb.FAULT_KIND_STATE_LOST if isinstance(e, StateLost) else pb.FAULT_KIND_COLLECTIVE_ERROR
            try:
                assert t.link is not None
                t.link.fault(kind, plan.generation, -1, detail)
            except AgentConnectionError:
                pass
        else:
            log.info("regroup: generation %d aborted while forming: %s", plan.generation, e)
        t.leave()
        if groups is None:
            sockets.release()  # nothing else holds them: no group was built over them
        t.busy = False
        return
    t.busy = False
    t.committed_step = plan.committed_step
    t.heard_commit_step = max(t.heard_commit_step, plan.committed_step)
    t.resume_from = None
    t.membership.enter(Generation(plan.epoch, plan.generation, layout.rank, layout.world_size,
                                  layout.dp, layout.replica, layout.replica_size, layout.position,
                                  begin, count, plan.committed_step, groups), layout.position)
    t.metrics["generations"] += 1
    t.metrics["rebuild_s"].append(time.monotonic() - started)
    if t.managed and t.link is not None and groups is not None and layout.world_size > 1:
        t.membership.peer_watch = PeerWatch(sockets.fds, _closed_peer_reporter(t, mark, layout.rank))
    if t.managed and t.link is not None:
        try:
            t.link.ack(start.directive_id)
        except AgentConnectionError:
            pass
    log.info("regroup: generation %d (epoch %d): rank %d of %d, dp %d, micro-batches [%d, %d), "
             "resuming at step %d; formed in %.1f ms", plan.generation, plan.epoch, layout.rank,
             layout.world_size, layout.dp, begin, begin + count, plan.committed_step + 1,
             (time.monotonic() - started) * 1000)


def _closed_peer_reporter(t: Trainer, mark: Tuple[int, int], rank: int) -> Callable[[str], None]:
    """What a :class:`PeerWatch` calls when a peer's connection closed: an early report naming
    that peer (the sign a failed collective gives, given before any collective fails), while the
    generation runs and was not aborted (an abort shuts our own connections down)."""

    def closed(host: str) -> None:
        if t.membership.active != mark or t.membership.aborted() or t.link is None:
            return
        with contextlib.suppress(AgentConnectionError):
            t.link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, mark[1], t.committed_step + 1,
                         f"rank {rank}: its connection to {host} closed (the peer's process is gone)",
                         early=True, peer=host)

    return closed


def _missing_reporter(t: Trainer, generation: int) -> Callable[[List[int]], None]:
    """What the store's host calls while ranks of the generation it forms have not arrived: an
    early report naming them (the manager settles the loss of a pod whose stream broke with it)."""

    def missing(ranks: List[int]) -> None:
        if t.link is None:
            return
        shown = ", ".join(map(str, ranks[:16])) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")
        with contextlib.suppress(AgentConnectionError):
            t.link.fault(pb.FAULT_KIND_COLLECTIVE_ERROR, generation, t.committed_step + 1,
                         f"ranks {shown} of generation {generation} have not reached its store",
                         early=True, missing_ranks=ranks)

    return missing


class _AbortFlag:
    """``is_set()`` for the rendezvous: whether the generation being formed was aborted."""

    def __init__(self, trainer: Trainer):
        self._trainer = trainer

    def is_set(self) -> bool:
        return self._trainer.membership.aborted()


def single_process_groups(layout: Layout, backend: str) -> ProcessGroups:
    """A world of one without an agent: a group over an in-memory store (no sockets)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    groups = ProcessGroups(layout, backend, store, GroupSockets(0))
    groups.dp_group = dist.group.WORLD
    run_builders(groups)  # a framework's groups (regroup.megatron) in a world of one too
    return groups


def build_ddp(model: torch.nn.Module, groups: ProcessGroups, global_batch: int) -> Any:
    """DistributedDataParallel over the data-parallel group: buffers not broadcast, gradients
    summed then divided by the global batch size (the step contract), never averaged."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Each replica keeps its own buffers (batch-norm statistics): not broadcast at construction
    # either, where DDP would otherwise copy replica 0's over the others at every rebuild.
    buffers = [name for name, _ in model.named_buffers()]
    if buffers and hasattr(DDP, "_set_params_and_buffers_to_ignore_for_model"):
        DDP._set_params_and_buffers_to_ignore_for_model(model, buffers)
    ddp = DDP(model, process_group=groups.dp_group, broadcast_buffers=False)
    gloo = groups.backend == "gloo"
    sockets = groups.sockets

    def sum_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
        tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state, async_op=True)
        if gloo:  # an abort fails the future at once, so backward() raises (see regroup.abort)
            return sockets.future(work, lambda t: t.div_(global_batch))

        def divide(f):
            return f.value()[0].div_(global_batch)

        return work.get_future().then(divide)

    ddp.register_comm_hook(groups.dp_group, sum_hook)
    return ddp
