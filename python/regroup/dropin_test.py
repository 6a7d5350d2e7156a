# SPDX-License-Identifier: Apache-2.0
"""The drop-in's promises that need no cluster: five changed lines, and the unmodified script's
sample order (end to end: dropin_e2e_test.py)."""

from __future__ import annotations

import difflib

import pytest
import torch

from regroup.dropin import SamplerOrder
from regroup.testing import REPO


def changed_lines(before: str, after: str) -> int:
    """Lines of ``after`` that are new or rewritten (a rewritten line counts once)."""
    diff = difflib.ndiff(before.splitlines(), after.splitlines())
    return sum(1 for line in diff if line.startswith("+ "))


def test_the_drop_in_changes_at_most_five_lines_of_the_plain_ddp_script():
    before = (REPO / "examples" / "ddp_plain.py").read_text()
    after = (REPO / "examples" / "ddp_regroup.py").read_text()
    assert changed_lines(before, after) <= 5, "".join(difflib.unified_diff(
        before.splitlines(True), after.splitlines(True), "ddp_plain.py", "ddp_regroup.py"))


def test_the_readmes_before_and_after_are_the_example_files():
    readme = (REPO / "python" / "README.md").read_text()
    for name in ("ddp_plain.py", "ddp_regroup.py"):
        assert f"examples/{name}" in readme


@pytest.mark.parametrize("size,replicas,shuffle,drop_last", [
    (256, 4, True, True), (256, 4, False, False), (250, 4, True, False), (250, 4, True, True),
    (10, 3, True, False), (7, 8, True, False), (100, 1, True, True)])
def test_the_order_is_torchs_distributed_sampler_for_every_rank(size, replicas, shuffle, drop_last):
    order = SamplerOrder(size, shuffle, 7, drop_last, replicas)
    data = list(range(size))
    for epoch in (0, 3):
        for u in range(replicas):
            s = torch.utils.data.DistributedSampler(data, num_replicas=replicas, rank=u, shuffle=shuffle,
                                                    seed=7, drop_last=drop_last)
            s.set_epoch(epoch)
            assert order.unit(epoch, u).tolist() == list(s), f"epoch {epoch}, rank {u}"


def test_a_rank_standing_in_for_several_gets_their_batches_concatenated():
    order = SamplerOrder(64, True, 0, True, 4)
    first, third = order.unit(1, 1)[8:16].tolist(), order.unit(1, 3)[8:16].tolist()
    assert order.item(1, [1, 3], 1, 8) == first + third
