# SPDX-License-Identifier: Apache-2.0
"""A distributed optimizer (ZeRO-1) that recovers in place: ``TrainerConfig(optimizer_sharding="zero1")``.

Every rank holds its local parameters (the whole model in replicas of one rank; on a tp x pp
grid its hand-split shard of its pipeline stage, or its DTensors' local shards under
``tensor_parallel_plan``: regroup.tensor_parallel.ZeroTensorParallelState) but only a slice of
their optimizer state. A
position of the grid (a tensor-parallel rank of a stage; the only one in replicas of one rank)
is sharded over its data-parallel group, the ranks at that position in every replica (the group
the trainer reduces its gradients over), and ``r`` below is a rank's index there (its replica).
The trainable parameters, flattened in ``model.parameters()`` order (``n`` elements), are cut
into ``dp`` contiguous slices by one deterministic rule of the generation's data-parallel size:
slice ``k`` is ``[k * n // dp, (k + 1) * n // dp)`` (:func:`slice_bounds`). Rank ``r`` owns slice
``r``; with ``optimizer_copies=2`` it also keeps a second copy of slice ``(r + dp // 2) % dp``,
half the ring away, so that losing a node (a block of at most ``dp // 2`` consecutive replicas,
the ring wrapping around) leaves one copy of every slice.

A step (:meth:`ZeroState.prepare`, in the trainer's reduce, before the vote): the gradients are
summed over the replicas and divided by the global batch as always; each rank runs the script's
optimizer (its class and hyper-parameters, the LR scheduler's current ones) on each slice it
holds, on copies of the slice's state, and the owners' new parameter slices are all-gathered, so
every replica holds the whole new model. The apply (:meth:`ZeroState.apply_optimizer`, after the
vote) only swaps them in: no collective runs between the vote and the outcome, and the undo of
an applied step whose vote is rolled back puts back the previous slices by reference
(regroup.undo). The second copy is stepped, not sent: the same elementwise arithmetic on the
same inputs, so it stays bit-identical to the owner's, for no traffic. Only elementwise
optimizers qualify (:data:`ZERO_OPTIMIZERS`: SGD with or without momentum, Adam, AdamW,
RMSprop), whose step on a slice is the full optimizer's step restricted to it, exactly.

A generation change (restart in place, scale-in, scale-out) runs the ordinary state sync
(regroup.sync: a new rank receives the model, scheduler and extra state from a holder, without
the slices), then :meth:`ZeroState.after_sync` repartitions: one all-gather over the whole
generation says which slices of the old partition each rank holds, the ranks of each position
compute the same moves (:func:`plan_moves`), and each new slice is assembled from the
overlapping old ones, point to point between ranks of that position. A slice no rank of its
position holds (its owner lost, and no second copy, or both copies lost) cannot be recovered
from a peer: every rank of the generation fails naming "optimizer shard lost, no second copy"
and the position, and the job goes to its newest checkpoint. A checkpoint holds one file per
(position, slice): file ``position * dp + slice`` of ``tp * pp * dp`` (in replicas of one rank
``shard-0000k-of-0000D``), a position's first with its model shard and the rest of the state;
loading it gives a rank every slice of its position, which the same repartition cuts to the new
size.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.distributed as dist

from regroup.api import CheckpointError, ConfigError, StateLost, StateSyncError
from regroup.state import TrainingState, load_tree, local_tensor, recv_payload, save_tree, send_payload

log = logging.getLogger("regroup")

# Optimizers whose step is elementwise: on a slice of the flattened parameters it equals the
# full step restricted to that slice (no norm or other reduction over a whole tensor).
ZERO_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop)
LOST = "optimizer shard lost, no second copy"


def slice_bounds(numel: int, dp: int, k: int) -> Tuple[int, int]:
    """Slice ``k`` of ``numel`` flattened elements cut into ``dp`` contiguous slices."""
    return k * numel // dp, (k + 1) * numel // dp


def slices_of(rank: int, dp: int, copies: int) -> List[int]:
    """The slices rank ``rank`` holds at data-parallel size ``dp``: its own, then the second
    copy of the slice half the ring away (``copies=2``, ``dp > 1``)."""
    own = [rank]
    if copies == 2 and dp > 1:
        own.append((rank + dp // 2) % dp)
    return own


@dataclasses.dataclass(frozen=True)
class Move:
    """Elements ``[lo, hi)`` of old slice ``old`` go from rank ``source`` into new slice ``new``
    of rank ``dest`` (``source == dest``: a local copy)."""

    old: int
    new: int
    source: int
    dest: int
    lo: int
    hi: int


def where(position: int, replica_size: int, tp: int) -> str:
    """How a message names a grid position (nothing for replicas of one rank)."""
    if replica_size == 1:
        return ""
    return f" at position {position} (pipeline stage {position // tp}, tensor-parallel rank {position % tp})"


def lost_slices(held_by: Sequence[Set[int]], old_dp: int, copies: int, at: str = "") -> Optional[str]:
    """Why the old partition cannot be cut (some slice held by no rank), or None.

    ``at``: the grid position whose data-parallel group ``held_by`` is (:func:`where`)."""
    held = set().union(*held_by) if held_by else set()
    missing = [k for k in range(old_dp) if k not in held]
    if not missing:
        return None
    return (f"{LOST}: slice{'s' if len(missing) > 1 else ''} {missing}{at} of the optimizer state "
            f"(partitioned over dp {old_dp}) {'are' if len(missing) > 1 else 'is'} held by no rank of "
            f"the generation ({'set optimizer_copies=2 to keep one; ' if copies == 1 else 'both copies lost; '}"
            "the job must resume from its newest checkpoint)")


def plan_moves(held_by: Sequence[Set[int]], old_dp: int, new_dp: int, numel: int, copies: int,
               at: str = "") -> List[Move]:
    """What moves where to cut the old partition's slices into the new one's.

    Args:
        held_by: for each rank of the new generation's data-parallel group (its index there:
            the replica), the old slices it holds (empty: none).
        old_dp, new_dp: the data-parallel sizes of the old and the new partition.
        numel: the flattened parameters' size.
        copies: 1, or 2 (every rank also holds its second copy: :func:`slices_of`).
        at: the grid position, for the message (:func:`where`).

    Returns:
        Every piece each rank needs, in one order every rank computes alike (a rank's own
        pieces first from itself; else from the lowest rank that holds the old slice); sources
        and destinations are indices in ``held_by``.

    Raises:
        StateSyncError: some old slice is held by no rank ("optimizer shard lost, no second copy").
    """
    lost = lost_slices(held_by, old_dp, copies, at)
    if lost is not None:
        raise StateLost(lost)
    world = len(held_by)
    source: Dict[int, int] = {}
    for k in range(old_dp):
        source[k] = next(r for r in range(world) if k in held_by[r])
    moves = []
    for r in range(world):
        for j in slices_of(r, new_dp, copies):
            a, b = slice_bounds(numel, new_dp, j)
            for k in range(old_dp):
                c, d = slice_bounds(numel, old_dp, k)
                lo, hi = max(a, c), min(b, d)
                if lo < hi:
                    moves.append(Move(k, j, r if k in held_by[r] else source[k], r, lo, hi))
    return moves


def choose_partition(views: Sequence[Sequence[Tuple[int, Set[int]]]], at: str = "") -> Tuple[int, List[Set[int]]]:
    """The old partition to cut from, and which of its slices each rank holds.

    ``views[r]`` is every (dp, slices) holding of rank ``r`` at the committed step: its current
    one, and the one before its last cut when that cut's step is still the committed one (a
    generation that failed while some ranks had cut their slices and others had not). A
    partition every slice of which some rank holds is taken, the one most ranks hold first (then
    the larger dp); with none whole, the most nearly whole, for :func:`plan_moves` to name what
    is lost.

    Raises:
        StateSyncError: no rank holds any slice.
    """
    dps = sorted({d for view in views for d, _ in view if d})
    if not dps:
        raise StateLost(f"no rank{at} holds the optimizer state")

    def held_by(dp: int) -> List[Set[int]]:
        return [set().union(*[s for d, s in view if d == dp]) for view in views]

    def rank(dp: int) -> Tuple[int, int, int]:
        by = held_by(dp)
        missing = len(set(range(dp)) - set().union(*by))
        return (-missing, sum(1 for s in by if s), dp)

    best = max(dps, key=rank)
    return best, held_by(best)


def _piece(state: Dict[str, Any], start: int, length: int, lo: int, hi: int) -> Dict[str, Any]:
    """Elements ``[lo, hi)`` (global indices) of the state of a slice that starts at ``start``
    and holds ``length`` elements: its flat tensors cut (copies), its scalars as they are."""
    vectors, scalars = {}, {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == length:
            vectors[k] = v[lo - start:hi - start].clone()
        else:
            scalars[k] = v
    return {"vectors": vectors, "scalars": scalars}


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


class ZeroState(TrainingState):
    """The training state of a job whose optimizer state is sharded over its data-parallel ranks.

    Raises:
        ConfigError: no optimizer, one that is not elementwise (:data:`ZERO_OPTIMIZERS`), more
            than one parameter group, or a group that is not the model's trainable parameters
            in order, or parameters of several dtypes or devices.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 scheduler: Any = None, extra: Any = None, *, copies: int = 1, replica_size: int = 1,
                 tensor_parallel: Optional[int] = None):
        super().__init__(model, optimizer, scheduler, extra)
        self._init_zero(optimizer, copies, replica_size, tensor_parallel)

    def _init_zero(self, optimizer: Optional[torch.optim.Optimizer], copies: int, replica_size: int,
                   tensor_parallel: Optional[int]) -> None:
        """The checks and the partition's state (the base class's ``__init__`` ran first)."""
        if optimizer is None:
            raise ConfigError("optimizer_sharding='zero1' shards an optimizer's state: give the trainer the optimizer")
        if type(optimizer) not in ZERO_OPTIMIZERS:
            raise ConfigError(f"optimizer_sharding='zero1' steps slices of the flattened parameters, exact only for "
                              f"an elementwise optimizer ({', '.join(c.__name__ for c in ZERO_OPTIMIZERS)}); "
                              f"this is {type(optimizer).__name__}")
        if len(optimizer.param_groups) != 1:
            raise ConfigError(f"optimizer_sharding='zero1' takes an optimizer of one parameter group; this one "
                              f"has {len(optimizer.param_groups)}")
        params = self.parameters()
        if [id(p) for p in optimizer.param_groups[0]["params"]] != [id(p) for p in params]:
            raise ConfigError("optimizer_sharding='zero1' needs the optimizer over the model's trainable "
                              "parameters, in order: give it model.parameters()")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) != 1:
            raise ConfigError(f"optimizer_sharding='zero1' flattens the parameters: they must share one dtype "
                              f"and device, not {sorted(str(k) for k in kinds)}")
        self.copies = copies
        # The grid: ranks per replica (tp x pp) and tensor-parallel size; a position's slices
        # are cut from its own local parameters, over its data-parallel group.
        self.replica_size = replica_size
        self.tp = tensor_parallel or replica_size
        self.position = 0
        self.rank = 0                 # this rank's index in its position's data-parallel group
        self.dp = 1                   # the partition of ``held``
        # slice index -> that slice's optimizer state (flat tensors and scalars); replaced, never
        # changed in place, by every apply (the previous dict is the undo: regroup.undo)
        self.held: Dict[int, Dict[str, Any]] = {0: {}}
        self._pending: Optional[Tuple[torch.Tensor, Dict[int, Dict[str, Any]]]] = None
        # (committed step, dp, slices) held before the last cut, kept until a step of the new
        # partition commits: a generation that fails while cutting leaves some ranks cut and
        # others not, and the next one cuts again from whichever partition is whole
        self._earlier: Optional[Tuple[int, int, Dict[int, Dict[str, Any]]]] = None
        self._applies = 0
        self._slots: Dict[Tuple[int, int], Tuple[torch.nn.Parameter, torch.optim.Optimizer]] = {}
        self.bytes_received = 0       # optimizer state received at repartitions (a bench figure)

    @property
    def numel(self) -> int:
        """This rank's local parameters' elements (its position's: a DTensor's local shard)."""
        return sum(local_tensor(p).numel() for p in self.parameters())

    # -- a step ---------------------------------------------------------------------------------

    def _slot(self, a: int, b: int, like: torch.Tensor) -> Tuple[torch.nn.Parameter, torch.optim.Optimizer]:
        """The script's optimizer class over one flat slice parameter (kept while the partition is)."""
        slot = self._slots.get((a, b))
        if slot is None:
            p = torch.nn.Parameter(torch.empty(b - a, dtype=like.dtype, device=like.device))
            hyper = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
            slot = self._slots[(a, b)] = (p, type(self.optimizer)([p], **{k: v for k, v in hyper.items()
                                                                           if k in self.optimizer.defaults}))
        return slot

    def prepare(self, groups: Any) -> None:
        """The step on the slices held here, and the new parameters all-gathered (kept aside
        until :meth:`apply_optimizer`). Needs the reduced gradients.

        Raises:
            RuntimeError: the all-gather failed (an abort or a lost peer).
        """
        self._pending = None
        params = self.parameters()
        hyper = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        with torch.no_grad():
            flat = torch.cat([local_tensor(p).detach().reshape(-1) for p in params])
            grad = torch.cat([(local_tensor(p.grad) if p.grad is not None else torch.zeros_like(local_tensor(p)))
                              .reshape(-1) for p in params])
            stepped: Dict[int, Dict[str, Any]] = {}
            new_own: Optional[torch.Tensor] = None
            for k, st in self.held.items():
                a, b = slice_bounds(self.numel, self.dp, k)
                p, opt = self._slot(a, b, flat)
                p.copy_(flat[a:b])
                p.grad = grad[a:b]
                opt.param_groups[0].update(hyper)
                opt.state.clear()
                if st:
                    opt.state[p] = {key: _clone(v) for key, v in st.items()}
                opt.step()
                stepped[k] = dict(opt.state[p])
                opt.state.clear()
                p.grad = None
                if k == self.rank:
                    new_own = p.detach().clone()
        assert new_own is not None, f"rank {self.rank} holds no slice of its own"
        if self.dp == 1:
            self._pending = (new_own, stepped)
            return
        width = max(b - a for a, b in (slice_bounds(self.numel, self.dp, k) for k in range(self.dp)))
        mine = torch.zeros(width, dtype=flat.dtype, device=flat.device)
        mine[:new_own.numel()] = new_own
        out = [torch.empty_like(mine) for _ in range(self.dp)]
        group = groups.dp_group if groups is not None else None
        if groups is not None and groups.backend == "gloo":
            groups.sockets.wait(dist.all_gather(out, mine, group=group, async_op=True), "ZeRO-1's all-gather")
        else:
            dist.all_gather(out, mine, group=group)
        parts = []
        for k in range(self.dp):
            a, b = slice_bounds(self.numel, self.dp, k)
            parts.append(out[k][:b - a])
        self._pending = (torch.cat(parts), stepped)

    def apply_optimizer(self) -> None:
        """Swaps in what :meth:`prepare` computed: the new parameters and slices."""
        if self._pending is None:
            raise RuntimeError("ZeRO-1: a step is applied without its prepared update")
        flat, stepped = self._pending
        self._pending = None
        with torch.no_grad():
            offset = 0
            for p in self.parameters():
                local = local_tensor(p)
                n = local.numel()
                local.copy_(flat[offset:offset + n].view_as(local))
                offset += n
        self.held = stepped
        self._applies += 1
        if self._applies >= 2:   # applying a second step: the first one of the partition committed
            self._earlier = None
        # The script's optimizer did step, for its LR scheduler's check of the order (torch 1.x
        # counts the steps, 2.x marks one), which would otherwise warn.
        opt = self.optimizer
        opt._step_count = getattr(opt, "_step_count", 0) + 1
        opt._opt_called = True

    def undo_take(self) -> Any:
        return self.held  # replaced, never changed, by the apply

    def undo_restore(self, held: Any) -> None:
        self.held = held
        self._pending = None

    # -- a generation ---------------------------------------------------------------------------

    def after_sync(self, layout: Any, groups: Any, holders: Sequence[bool], committed_step: int,
                   device: torch.device) -> int:
        """Cuts the held slices into the new generation's partition (see the module's docstring);
        returns the bytes sent (``bytes_received`` adds up what came).

        Raises:
            StateSyncError: a slice is lost ("optimizer shard lost, no second copy"), or no rank
                holds any.
            RuntimeError: a collective failed.
        """
        R = layout.replica_size
        if R != self.replica_size:
            raise ConfigError(f"optimizer_sharding='zero1' was set up for replicas of {self.replica_size} "
                              f"ranks; the generation has {R} (tensor x pipeline parallel)")
        self._pending = None
        self._slots.clear()
        world, rank, new_dp = layout.world_size, layout.rank, layout.dp
        position, me = layout.position, layout.replica   # me: this rank's index in its dp group
        self.tp = layout.tp
        mine = slices_of(me, new_dp, self.copies)
        if committed_step < 0:  # nothing stepped yet: every slice starts empty
            self.held, self.dp, self.rank, self.position = {j: {} for j in mine}, new_dp, me, position
            return 0
        holdings: List[Tuple[int, Dict[int, Dict[str, Any]]]] = []
        if holders[rank]:
            holdings.append((self.dp, self.held))
            if self._earlier is not None and self._earlier[0] == committed_step and self._earlier[1] != self.dp:
                holdings.append(self._earlier[1:])
        mine_view = [(d, set(h)) for d, h in holdings]
        # The census is over the whole generation: every rank learns every position's holdings,
        # so that a slice lost at any position fails every rank alike, naming it.
        views = [mine_view] if world == 1 else self._census(groups, mine_view, world, device)
        partitions, lost = [], []
        for p in range(R):
            at = where(p, R, layout.tp)
            dp_p, held_p = choose_partition(views[p::R], at)   # the ranks at p, replica order
            partitions.append((dp_p, held_p))
            why = lost_slices(held_p, dp_p, self.copies, at)
            if why is not None:
                lost.append(why)
        if lost:
            raise StateLost("; ".join(lost))
        old_dp, held_by = partitions[position]
        source = next((h for d, h in holdings if d == old_dp), {})
        moves = plan_moves(held_by, old_dp, new_dp, self.numel, self.copies, where(position, R, layout.tp))
        call = groups.sockets.call if groups is not None and groups.backend == "gloo" else None
        pieces: Dict[int, List[Tuple[int, Dict[str, Any]]]] = {j: [] for j in mine}
        sent = received = 0
        for m in moves:   # point to point between the ranks at this position (global rank i * R + p)
            if m.source == me:
                c, d = slice_bounds(self.numel, old_dp, m.old)
                piece = _piece(source[m.old], c, d - c, m.lo, m.hi)
                if m.dest == me:
                    pieces[m.new].append((m.lo, piece))
                    continue
                buffer = io.BytesIO()
                save_tree(piece, buffer)
                data = bytearray(buffer.getvalue())
                dest = m.dest * R + position
                if call is not None:
                    call(send_payload, data, [dest], device)
                else:
                    send_payload(data, [dest], device)
                sent += len(data)
            elif m.dest == me:
                src = m.source * R + position
                data = call(recv_payload, src, device) if call is not None else recv_payload(src, device)
                received += len(data)
                pieces[m.new].append((m.lo, load_tree(io.BytesIO(data))))
        if old_dp != new_dp and source:
            self._earlier = (committed_step, old_dp, source)
        self.held = {j: self._assemble(j, new_dp, pieces[j]) for j in mine}
        self.dp, self.rank, self.position, self._applies = new_dp, me, position, 0
        self.bytes_received += received
        log.info("regroup: ZeRO-1 optimizer slices %s%s of dp %d assembled from dp %d (%d bytes received)",
                 mine, where(position, R, layout.tp), new_dp, old_dp, received)
        return sent

    def _census(self, groups: Any, mine: List[Tuple[int, Set[int]]], world: int,
                device: torch.device) -> List[List[Tuple[int, Set[int]]]]:
        """Every rank's holdings (up to two: (dp, slices)), over the new generation's group."""
        def gather(tensor: torch.Tensor) -> List[torch.Tensor]:
            out = [torch.zeros_like(tensor) for _ in range(world)]
            if groups.backend == "gloo":
                groups.sockets.wait(dist.all_gather(out, tensor, async_op=True), "the ZeRO-1 census")
            else:
                dist.all_gather(out, tensor)
            return out

        dps = [d for d, _ in mine] + [0] * (2 - len(mine))
        everyone = gather(torch.tensor(dps, dtype=torch.int64, device=device))
        width = max(1, max(int(x) for d in everyone for x in d.tolist()))
        mask = torch.zeros(2, width, dtype=torch.int64, device=device)
        for i, (_, held) in enumerate(mine):
            for k in held:
                mask[i, k] = 1
        masks = gather(mask)
        return [[(int(d[i]), {k for k in range(width) if int(m[i, k])}) for i in range(2) if int(d[i])]
                for d, m in zip(everyone, masks)]

    def _assemble(self, j: int, dp: int, pieces: List[Tuple[int, Dict[str, Any]]]) -> Dict[str, Any]:
        """New slice ``j``'s state from its pieces (each ``(lo, piece)``, global indices)."""
        a, b = slice_bounds(self.numel, dp, j)
        out: Dict[str, Any] = {}
        for lo, piece in pieces:
            for key, v in piece["vectors"].items():
                if key not in out:
                    out[key] = torch.empty(b - a, dtype=v.dtype, device=v.device)
                out[key][lo - a:lo - a + v.numel()].copy_(v)
            for key, v in piece["scalars"].items():
                out.setdefault(key, _clone(v))
        return out

    # -- checkpoints and transfers --------------------------------------------------------------

    def to_bytes(self, committed_step: int) -> bytes:
        """The state a new rank receives at a sync: without the slices (it gets its own after)."""
        buffer = io.BytesIO()
        save_tree(super().state_dict(committed_step), buffer)
        return buffer.getvalue()

    def checkpoint_files(self, generation: Any, dump: bool, position: int, count: int) -> List[Tuple[int, int, Any]]:
        """One file per (position, slice), file ``position * dp + slice`` of ``tp * pp * dp``
        (replicas of one rank: file ``slice`` of ``dp``): the owner writes its own at a periodic
        checkpoint; a dump writes every slice held here (a second copy stands for a lost owner)."""
        files = count * self.dp
        if dump:
            return [(position * self.dp + k, files, k) for k in sorted(self.held)]
        return [(position * self.dp + self.rank, files, self.rank)]

    def checkpoint_state(self, committed_step: int, part: Any) -> Dict[str, Any]:
        """Slice ``part``'s file: a position's first also holds its model shard and the rest of
        the state, the others their slice only (a checkpoint is then the size of an unsharded one)."""
        out = super().state_dict(committed_step) if part == 0 else {"committed_step": committed_step}
        out["zero1"] = {"dp": self.dp, "numel": self.numel, "position": self.position,
                        "slices": {part: self.held[part]}}
        return out

    def state_dict(self, committed_step: int) -> Dict[str, Any]:
        out = super().state_dict(committed_step)
        out["zero1"] = {"dp": self.dp, "numel": self.numel, "slices": dict(self.held)}
        return out

    def load_state_dict(self, state: Dict[str, Any]) -> int:
        state = dict(state)
        meta = state.pop("zero1", None)
        step = super().load_state_dict(state)
        if meta is not None:
            self._take_slices(meta, meta["slices"])
        return step

    def _take_slices(self, meta: Dict[str, Any], slices: Dict[int, Any]) -> None:
        if int(meta["numel"]) != self.numel:
            raise StateSyncError(f"the optimizer slices are of {meta['numel']} parameters, the model has {self.numel}")
        self.held, self.dp = {int(k): v for k, v in slices.items()}, int(meta["dp"])
        self._pending = None

    def load_checkpoint(self, checkpointer: Any, info: Any, position: int) -> None:
        """Loads the model and the rest from ``position``'s first file, and every slice of that
        position from all of its files (the first rank's random generators, as an unsharded
        checkpoint holds replica 0's)."""
        if info.replica_size % self.replica_size:
            raise CheckpointError(f"checkpoint {info.path} has {info.replica_size} files, not a multiple of "
                                  f"{self.replica_size} positions: the job's tensor x pipeline size changed")
        files = info.replica_size // self.replica_size   # the dp the checkpoint was written at
        first = checkpointer.load(info, position * files)
        meta = first.get("zero1")
        if meta is None:
            raise CheckpointError(f"checkpoint {info.path} holds a whole optimizer state, not ZeRO-1 slices: "
                                  "resume it without optimizer_sharding")
        if int(meta["dp"]) != files or int(meta.get("position", 0)) != position:
            raise CheckpointError(f"checkpoint {info.path}: file {position * files} holds position "
                                  f"{meta.get('position', 0)} at dp {meta['dp']}, not position {position} of "
                                  f"{self.replica_size} at dp {files}: the job's tensor x pipeline size changed")
        slices: Dict[int, Any] = {}
        for f in range(files):
            part = first if f == 0 else checkpointer.load(info, position * files + f)
            slices.update({int(k): v for k, v in part["zero1"]["slices"].items()})
        if set(slices) != set(range(int(meta["dp"]))):
            raise CheckpointError(f"checkpoint {info.path} holds optimizer slices {sorted(slices)}"
                                  f"{where(position, self.replica_size, self.tp)} of dp {meta['dp']}")
        self.load_state_dict({k: v for k, v in first.items() if k != "zero1"})
        self._take_slices(meta, slices)
