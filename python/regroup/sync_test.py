# SPDX-License-Identifier: Apache-2.0
"""Who sends the state to whom when a generation forms (regroup.sync.plan_transfers)."""

import pytest

from regroup.api import StateSyncError
from regroup.sync import Transfer, plan_transfers


def test_a_fresh_job_starts_from_replica_0s_initialisation():
    assert plan_transfers([False] * 4, 1, -1) == [Transfer(0, 0, (1, 2, 3))]


def test_a_fresh_job_with_tensor_parallelism_gets_each_shard_from_replica_0():
    # Two replicas of two ranks: rank 0 sends shard 0 to rank 2, rank 1 sends shard 1 to rank 3.
    assert plan_transfers([False] * 4, 2, -1) == [Transfer(0, 0, (2,)), Transfer(1, 1, (3,))]


def test_only_a_rank_without_the_state_receives_it_from_its_position_in_a_holding_replica():
    # A restarted process at rank 3 (position 1 of replica 1): its peer at position 1 sends.
    assert plan_transfers([True, True, True, False], 2, 7) == [Transfer(1, 1, (3,))]


def test_nobody_receives_when_every_rank_holds_the_state():
    assert plan_transfers([True] * 4, 2, 7) == []


def test_a_rank_that_applied_its_voted_step_holds_it_and_a_fresh_rank_0_receives_from_it():
    # The new rank 0 is a restarted process; ranks 1 and 2 applied step 7 while forming the
    # generation (they voted for it and the commit came after the abort).
    assert plan_transfers([False, True, True], 1, 7) == [Transfer(0, 1, (0,))]


def test_the_sources_come_from_one_replica_the_lowest_that_holds_the_state():
    # Replica 0 is new (ranks 0, 1); replicas 1 and 2 hold: replica 1 sends both shards.
    holders = [False, False, True, True, True, True]
    assert plan_transfers(holders, 2, 3) == [Transfer(0, 2, (0,)), Transfer(1, 3, (1,))]


def test_a_position_missing_in_the_source_replica_is_sent_by_another_replica():
    # Replica 1's position 0 was restarted, replica 0 is new: position 0 comes from replica 2.
    holders = [False, False, False, True, True, True]
    assert plan_transfers(holders, 2, 3) == [Transfer(0, 4, (0, 2)), Transfer(1, 3, (1,))]


def test_before_the_first_commit_a_position_nobody_holds_keeps_the_source_replicas_initialisation():
    # One replica of two ranks; position 1 was restarted before any commit: nobody holds its
    # shard of the job's state, so its own initialisation stands and nothing is sent.
    assert plan_transfers([True, False], 2, -1) == []


def test_after_a_commit_a_position_nobody_holds_cannot_be_recovered():
    with pytest.raises(StateSyncError, match="no rank at position 1 holds the state at step 4"):
        plan_transfers([True, False, True, False], 2, 4)


def test_a_world_of_one_that_lacks_the_committed_state_cannot_be_recovered():
    with pytest.raises(StateSyncError, match="position 0"):
        plan_transfers([False], 1, 4)
    assert plan_transfers([False], 1, -1) == []
