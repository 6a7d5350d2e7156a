# SPDX-License-Identifier: Apache-2.0
"""Settling a rank's vote when it enters a new generation (forming.settle_vote): the step it
applied when it voted is kept only when the step was committed by the generation it voted in,
and undone otherwise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import List

from regroup._proto import wire_pb2 as pb
from regroup.forming import settle_vote
from regroup.group import Layout
from regroup.trainer import _Voted


class _State:
    def __init__(self) -> None:
        self.calls: List[str] = []

    def zero_grad(self) -> None:
        self.calls.append("zero_grad")


def _rank(voted_in: tuple) -> SimpleNamespace:
    t = SimpleNamespace(state=_State(), committed_step=87, heard_commit_step=87)
    t.voted = _Voted(88, voted_in, "before-88")

    def finalize_vote(voted, in_flight, checkpoint=True):
        t.state.calls.append(f"keep {voted.step}")
        t.committed_step = voted.step

    t.finalize_vote = finalize_vote
    t.restore_voted = lambda voted: t.state.calls.append(f"undo {voted.step} to {voted.snapshot}")
    return t


def _plan(committed_by: tuple) -> pb.GenerationPlan:
    return pb.GenerationPlan(epoch=2, generation=4, committed_step=88,
                             committed_epoch=committed_by[0], committed_generation=committed_by[1])


def test_a_vote_of_the_generation_that_committed_the_step_is_applied():
    t = _rank((2, 2))
    settle_vote(t, _plan((2, 2)), Layout(8, 6, 1), 0, 1)
    assert t.state.calls == ["keep 88", "zero_grad"] and t.committed_step == 88


def test_a_vote_of_an_aborted_generation_is_dropped_when_another_one_committed_the_step():
    # Found by the chaos soak (seed 1): the readmitted rank voted for step 88 in generation 2,
    # which was aborted for it; generation 3, without it, committed its own step 88. Applying
    # the old vote made the replicas disagree at the next checksum.
    t = _rank((2, 2))
    settle_vote(t, _plan((2, 3)), Layout(8, 6, 1), 0, 1)
    assert t.state.calls == ["undo 88 to before-88", "zero_grad"] and t.committed_step == 87


def test_a_plan_that_does_not_know_the_committing_generation_keeps_the_old_rule():
    t = _rank((1, 9))  # a restarted manager heard the commit from the agents
    settle_vote(t, _plan((0, 0)), Layout(8, 6, 1), 0, 1)
    assert t.state.calls == ["keep 88", "zero_grad"] and t.committed_step == 88
