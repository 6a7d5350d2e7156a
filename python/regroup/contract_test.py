"""The step contract: fixed micro-batches of global sample indices and per-micro-batch RNG."""

import torch

from regroup import contract


def test_every_sample_is_in_exactly_one_micro_batch_per_epoch():
    s = contract.Sampler(dataset_size=96, micro_batch_size=4, microbatches_per_step=6, seed=5)
    assert s.steps_per_epoch == 4
    for epoch in range(3):
        seen = torch.cat([s.step_samples(step) for step in range(epoch * 4, epoch * 4 + 4)])
        assert sorted(seen.tolist()) == list(range(96))


def test_epochs_are_permuted_differently_and_reproducibly():
    a = contract.Sampler(64, 4, 4, seed=1)
    b = contract.Sampler(64, 4, 4, seed=1)
    assert torch.equal(a.microbatch(3, 2), b.microbatch(3, 2))
    assert not torch.equal(a.step_samples(0), a.step_samples(4))  # epoch 0 vs epoch 1
    assert not torch.equal(a.step_samples(0), contract.Sampler(64, 4, 4, seed=2).step_samples(0))


def test_the_remainder_of_an_epoch_is_dropped():
    s = contract.Sampler(dataset_size=30, micro_batch_size=4, microbatches_per_step=2, seed=0)
    assert s.steps_per_epoch == 3
    assert s.epoch_of(3) == 1


def test_spread_matches_the_managers_rule():
    # plugin/sizing.cc SpreadMicroBatches: the first (m % dp) replicas get one more.
    assert contract.spread(8, 3) == [3, 3, 2]
    assert contract.spread(2, 4) == [1, 1, 0, 0]
    assert contract.replica_range(8, 3, 2) == (6, 2)
    ranges = [contract.replica_range(13, 5, r) for r in range(5)]
    assert [b for b, _ in ranges] == [0, 3, 6, 9, 11] and sum(c for _, c in ranges) == 13


def test_micro_batch_seeds_depend_on_seed_step_and_index_only():
    seeds = {contract.microbatch_seed(seed, step, j) for seed in range(3) for step in range(5) for j in range(4)}
    assert len(seeds) == 60
    assert contract.microbatch_seed(7, 100, 3) == contract.microbatch_seed(7, 100, 3)
    assert 0 <= contract.microbatch_seed(7, 100, 3) < 2 ** 63


def test_seeded_rng_gives_the_same_numbers_and_restores_the_global_state():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with contract.seeded_rng(42):
        a = torch.rand(5)
    assert torch.equal(torch.get_rng_state(), before)
    torch.rand(3)  # move the global generator: the micro-batch's numbers do not change
    with contract.seeded_rng(42):
        b = torch.rand(5)
    assert torch.equal(a, b)


def test_checksum_sees_any_bit_and_is_never_zero():
    t = torch.arange(10, dtype=torch.float64)
    u = t.clone()
    u[3] = torch.nextafter(u[3], torch.tensor(100.0, dtype=torch.float64))
    assert contract.checksum([t]) != contract.checksum([u])
    assert contract.checksum([t]) == contract.checksum([t.clone()])
    assert contract.checksum([]) != 0
    assert contract.checksum([torch.tensor(1.5)]) != 0  # 0-dim tensors too
