# SPDX-License-Identifier: Apache-2.0
"""State sync: when a generation forms, the ranks that lack the state at its committed step
receive it from a rank at their position in a replica that holds it (regroup.state moves it).

Who owns the plan. The manager decides who is in the generation and the step it resumes after
(``GenerationPlan.committed_step``: the step commit); the ranks of the new generation decide,
here, who sends the state to whom. Only a rank knows for sure what it holds at that moment: it
kept or undid, while forming the generation, a step it voted for and applied whose commit it
never heard (regroup.forming.settle_vote); a rank that was told of a generation but never finished its state
sync holds only its own initialisation; the manager's record of each rank comes from heartbeats,
a beat behind. So every rank says whether it holds the state, in one all-gather over the new
generation's group (the census), and every rank computes the same transfers from the same answers
(:func:`plan_transfers`). The plan carries no sources.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, List, Sequence, Tuple

import torch
import torch.distributed as dist

from regroup.api import StateLost, StateSyncError
from regroup.group import Layout, ProcessGroups
from regroup.state import recv_state, send_state

if TYPE_CHECKING:
    from regroup.trainer import Trainer

log = logging.getLogger("regroup")


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One position's state transfer: ``source`` sends its shard to ``receivers``."""

    position: int
    source: int
    receivers: Tuple[int, ...]


def plan_transfers(holders: Sequence[bool], replica_size: int, committed_step: int) -> List[Transfer]:
    """Who sends the state at ``committed_step`` to whom, from the census.

    Every rank that does not hold the state receives it from one rank at its position that does.
    The sources are taken from one replica where it can be (the replica of the lowest-ranked
    holder), so a receiver's replica gets the shards, and the buffers, of one replica. Before the
    first commit (``committed_step < 0``) a position nobody holds starts from that replica's own
    initialisation, and a fresh job from replica 0's: every other rank receives it.

    Args:
        holders: for each rank of the generation, whether it holds the state at the step.
        replica_size: ranks per replica (tensor x pipeline parallel).
        committed_step: the step the generation resumes after.

    Returns:
        One transfer per position that has a receiver, in position order.

    Raises:
        StateSyncError: no rank at some position holds the state, after the first commit.
    """
    world = len(holders)
    first = next((r for r in range(world) if holders[r]), 0)
    source_replica = first // replica_size
    transfers = []
    for position in range(replica_size):
        ranks = range(position, world, replica_size)
        preferred = source_replica * replica_size + position
        holding = [r for r in ranks if holders[r]]
        if holders[preferred] or (not holding and committed_step < 0):
            src = preferred
        elif holding:
            src = holding[0]
        else:
            raise StateLost(f"no rank at position {position} holds the state at step "
                                 f"{committed_step}: it cannot be recovered from a peer")
        to = tuple(r for r in ranks if r != src and not holders[r])
        if to:
            transfers.append(Transfer(position, src, to))
    return transfers


def sync_state(t: Trainer, plan: Any, layout: Layout, groups: ProcessGroups) -> None:
    """Brings every rank of the generation to the state at ``plan.committed_step``.

    Raises:
        StateSyncError: nobody holds the state, or a sender sent another step's.
        RuntimeError: a collective failed (an abort, or a peer lost).
    """
    # Load the checkpoint this rank announced, if it still holds nothing newer.
    if t.resume_from is not None and t.committed_step == t.resume_from.step == plan.committed_step:
        t.state.load_checkpoint(t.checkpointer, t.resume_from, layout.position)
    # Before the first commit every rank is at step -1, but only one that finished a state sync
    # holds the job's state; the others hold their own initialisation.
    holds = t.committed_step == plan.committed_step and (plan.committed_step >= 0 or t.synced)
    if layout.world_size == 1:
        holders = [holds]
    else:
        # The census: every rank says whether it holds the state, over the new group.
        mine = torch.tensor([int(holds), t.committed_step], dtype=torch.int64, device=t.device)
        everyone = [torch.zeros_like(mine) for _ in range(layout.world_size)]
        if groups.backend == "gloo":  # an abort frees this rank at once (see regroup.abort)
            groups.sockets.wait(dist.all_gather(everyone, mine, async_op=True), "the state-sync census")
        else:
            dist.all_gather(everyone, mine)
        holders = [bool(x[0].item()) for x in everyone]
    call = groups.sockets.call if groups.backend == "gloo" else None
    received = False
    for transfer in plan_transfers(holders, layout.replica_size, plan.committed_step):
        src, to = transfer.source, list(transfer.receivers)
        if layout.rank == src:
            t.metrics["state_bytes_sent"] += send_state(t.state, plan.committed_step, to, t.device, call=call)
        elif layout.rank in to:
            got = recv_state(t.state, src, t.device, call=call)
            if got != plan.committed_step:
                raise StateSyncError(f"rank {src} sent the state of step {got}, not "
                                     f"{plan.committed_step}")
            received = True
            log.info("regroup: received the state of step %d from rank %d", got, src)
    # A distributed optimizer (regroup.zero) cuts its slices to the new partition.
    t.metrics["state_bytes_sent"] += t.state.after_sync(layout, groups, holders, plan.committed_step, t.device)
    # Only now is the whole state at the step: a receiver whose optimizer slices could not be cut
    # holds the model of the step and the optimizer of none, and claims nothing (in the next
    # census it would have offered a fresh optimizer as the step's).
    if received:
        t.committed_step = plan.committed_step
    t.synced = True
