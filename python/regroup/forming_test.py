# SPDX-License-Identifier: Apache-2.0
"""Settling a rank's vote when it enters a new generation (forming.settle_vote): the step it
applied when it voted is kept only when the step was committed by the generation it voted in,
and undone otherwise. And a generation that could not form is reported without a step, as
state_lost where part of the state is held by no rank."""

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


def _failed_forming(monkeypatch, error: Exception) -> list:
    """The faults a managed rank reports when forming generation 5 raises ``error``."""
    import regroup.forming as forming
    from regroup.api import Timeouts, TrainerConfig
    from regroup.membership import Membership

    def fails(**kwargs):
        raise error

    monkeypatch.setattr(forming, "build_groups", fails)
    faults = []
    config = TrainerConfig(dataset_size=64, micro_batch_size=4, microbatches_per_step=4,
                           timeouts=Timeouts(abort_grace=0.01))
    t = SimpleNamespace(config=config,
                        voted=None, committed_step=81, busy=False,
                        managed=True, backend="gloo", membership=Membership(),
                        report_phase=lambda phase, step: None, leave=lambda: None,
                        link=SimpleNamespace(fault=lambda *a: faults.append(a)))
    plan = pb.GenerationPlan(epoch=1, generation=5, world_size=2, committed_step=81,
                             store_host="10.0.0.1", store_port=4000)
    forming.enter(t, SimpleNamespace(plan=plan, assignment=pb.RankAssignment(rank=0, replica=0)))
    return faults


def test_a_generation_that_could_not_form_is_reported_without_a_step(monkeypatch):
    """No step ran: the failure names none, so that two failures to form at one point of the
    training are not taken for a poison step (the demo's job was dumped for one)."""
    faults = _failed_forming(monkeypatch, RuntimeError("the generation's store at 10.0.0.1:4000 did not come up"))
    assert len(faults) == 1, faults
    kind, generation, step, detail = faults[0]
    assert (kind, generation, step) == (pb.FAULT_KIND_COLLECTIVE_ERROR, 5, -1)
    assert "could not form generation 5" in detail and "did not come up" in detail


def test_state_held_by_no_rank_is_reported_as_state_lost(monkeypatch):
    """An optimizer slice without its second copy: the decision maker takes the job to its newest
    checkpoint on a state_lost fault (on a collective error it restarted the reporting rank in
    place, losing its slice too)."""
    from regroup.api import StateLost

    faults = _failed_forming(monkeypatch, StateLost("optimizer shard lost, no second copy: slice [3]"))
    assert [(kind, step) for kind, _, step, _ in faults] == [(pb.FAULT_KIND_STATE_LOST, -1)]
    assert "slice [3]" in faults[0][3]
