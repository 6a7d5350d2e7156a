"""State sync: when a generation forms, the ranks that lack the state at its committed step
receive it from a rank at their position in a replica that holds it (regroup.state moves it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from regroup.api import StateSyncError
from regroup.group import Layout, ProcessGroups
from regroup.state import recv_state, send_state

if TYPE_CHECKING:
    from regroup.trainer import Trainer

log = logging.getLogger("regroup")


def sync_state(t: Trainer, plan: Any, layout: Layout, groups: ProcessGroups) -> None:
    """Receivers get the state at plan.committed_step from a holder at their position."""
    # Load the checkpoint this rank announced, if it still holds nothing newer.
    if t._resume_from is not None and t.committed_step == t._resume_from.step == plan.committed_step:
        t.state.load_state_dict(t.checkpointer.load(t._resume_from, layout.position))
    holds = 1 if t.committed_step == plan.committed_step else 0
    needs = set(plan.needs_state)
    if plan.all_need_state:  # a first generation: everyone but the source receives
        needs = set(range(layout.world_size)) - {plan.sync_source_rank}
    if layout.world_size == 1:
        if not holds:
            raise StateSyncError(f"no rank holds the state at step {plan.committed_step}")
        return
    # Who holds the state at the committed step: every rank says, over the new group.
    mine = torch.tensor([holds, t.committed_step], dtype=torch.int64, device=t.device)
    everyone = [torch.zeros_like(mine) for _ in range(layout.world_size)]
    gloo = groups.backend == "gloo"
    if gloo:  # an abort frees this rank at once (see regroup.abort)
        groups.sockets.wait(dist.all_gather(everyone, mine, async_op=True), "the state-sync census")
    else:
        dist.all_gather(everyone, mine)
    holders = [bool(x[0].item()) for x in everyone]
    fresh = plan.committed_step < 0
    receivers = {r for r in range(layout.world_size) if r in needs or not holders[r]}
    sources = {}
    for position in range(layout.replica_size):
        ranks = layout.position_ranks(position)
        wanted = [r for r in ranks if r in receivers]
        if not wanted:
            continue
        source_replica = plan.sync_source_rank // layout.replica_size
        preferred = source_replica * layout.replica_size + position
        candidates = [r for r in ranks if holders[r] and r not in needs]
        if preferred in candidates or (fresh and holders[preferred]):
            src = preferred
        elif candidates:
            src = candidates[0]
        else:
            other = [r for r in ranks if holders[r]]
            if not other:
                raise StateSyncError(f"no rank at position {position} holds the state at step "
                                     f"{plan.committed_step}: it cannot be recovered from a peer")
            src = other[0]
        sources[position] = (src, [r for r in wanted if r != src])
    for position, (src, to) in sorted(sources.items()):
        if not to:
            continue
        if layout.rank == src:
            sent = send_state(t.state, plan.committed_step, to, t.device,
                              call=groups.sockets.call if gloo else None)
            t.metrics["state_bytes_sent"] += sent
        elif layout.rank in to:
            got = recv_state(t.state, src, t.device, call=groups.sockets.call if gloo else None)
            if got != plan.committed_step:
                raise StateSyncError(f"rank {src} sent the state of step {got}, not "
                                     f"{plan.committed_step}")
            t.committed_step = got
            log.info("regroup: received the state of step %d from rank %d", got, src)
