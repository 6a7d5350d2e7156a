# SPDX-License-Identifier: Apache-2.0
"""Test instrumentation shared by examples/ddp_plain.py and ddp_regroup.py: which samples each
step used, and a line per step. Without ``--ledger`` it only prints.

Each line of the ledger: ``{"g": [epoch, generation], "step": s, "rank": r, "samples": [...]}``,
one per batch a rank computed (the epoch is the manager's incarnation, not the data's). Under Regroup a failed step is computed again, in a later generation or
the same one: the samples a step committed are those of its highest generation's lines.
"""

import json
import os
import sys

import torch.distributed as dist


class Ledger:
    def __init__(self, path):
        self._file = open(path, "a") if path else None
        self._steps = 0

    def _where(self):
        regroup = sys.modules.get("regroup")
        if regroup is not None and os.environ.get("REGROUP_AGENT_SOCKET"):
            s = regroup.status()
            return [s["epoch"], s["generation"]], s["step"], s["rank"], s["world_size"], s["dp"]
        world = dist.get_world_size()
        return [0, 0], self._steps, dist.get_rank(), world, world

    def batch(self, indices):
        if self._file is None:
            return
        g, step, rank, _, _ = self._where()
        self._file.write(json.dumps({"g": g, "step": step, "rank": rank, "samples": indices.tolist()}) + "\n")
        self._file.flush()

    def stepped(self, loss):
        g, step, rank, world, dp = self._where()
        if rank == 0:
            print(f"step={step} loss={loss:.6f} world={world} dp={dp} generation={g[1]}", flush=True)
        self._steps += 1

    def close(self):
        if self._file is not None:
            self._file.close()
