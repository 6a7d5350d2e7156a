# SPDX-License-Identifier: Apache-2.0
"""The step contract: fixed micro-batches of global sample indices and per-micro-batch RNG."""

import ctypes
import json
import os
from pathlib import Path

import pytest
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


# (micro-batches per step, replicas): a remainder and none, as many of each, one replica, many.
# The engine plans no more replicas than micro-batches (a job with fewer is refused).
SPREAD_CASES = [(8, 3), (13, 5), (12, 4), (7, 7), (9, 2), (5, 1), (100, 7), (64, 63)]


def _libregroup():
    """libregroup.so of the build: in $REGROUP_BIN_DIR, else the repository's build/; or None."""
    dirs = [os.environ.get("REGROUP_BIN_DIR"), str(Path(__file__).resolve().parents[2] / "build")]
    for d in filter(None, dirs):
        path = Path(d) / "libregroup.so"
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            lib.regroup_error_message.restype = ctypes.c_char_p
            lib.regroup_engine_decision_json.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                         ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
            lib.regroup_string_free.argtypes = [ctypes.c_void_p]
            return lib
    return None


def _resumed_spread(lib, microbatches: int, replicas: int) -> list:
    """The micro-batches per replica of the engine's own plan (plugin/sizing.cc), through the C
    ABI: a job of `replicas` one-rank pods loses pod 0, its replacement registers, and the
    directive that resumes the job at full size carries the spread."""
    job_id = b"default/spread"
    job = {"id": "default/spread", "uid": "s1", "labels": {"fault-scheduling": "force"},
           "annotations": {"recover-strategy": "recover", "wait-reschedule-timeout": "30",
                           "regroup.io/global-batch-size": str(microbatches),
                           "regroup.io/micro-batch-size": "1"},
           "pods": replicas, "processes_per_pod": 1}
    pods = [{"type": "pod", "job": "default/spread", "index": i, "uid": f"p{i}", "phase": "running",
             "node": f"n{i}"} for i in range(replicas)]
    lost = {"type": "fault", "job": "default/spread", "kind": "pod_lost", "pods": [0]}
    replaced = [{"type": "pod", "job": "default/spread", "index": 0, "uid": "p0-b", "phase": "running",
                 "node": "spare"},
                {"type": "replacement_registered", "job": "default/spread", "index": 0, "uid": "p0-b"}]
    engine, err, text = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()

    def check(status):
        assert status == 0, lib.regroup_error_message(err).decode()

    check(lib.regroup_engine_new(ctypes.byref(engine), None, ctypes.byref(err)))
    try:
        spec = json.dumps(job).encode()
        check(lib.regroup_engine_upsert_job(engine, None, spec, ctypes.c_size_t(len(spec)),
                                            ctypes.c_int64(0), ctypes.byref(err)))
        for now, events in ((0, pods + [lost]), (2000, replaced)):
            data = json.dumps(events).encode()
            check(lib.regroup_engine_apply_events(engine, data, ctypes.c_size_t(len(data)),
                                                  ctypes.c_int64(now), ctypes.byref(err)))
            check(lib.regroup_engine_tick(engine, ctypes.c_int64(now + 1000), None, ctypes.byref(err)))
        check(lib.regroup_engine_decision_json(engine, ctypes.byref(text), job_id, ctypes.byref(err)))
        directive = json.loads(ctypes.string_at(text.value))["directive"]
        lib.regroup_string_free(text)
    finally:
        lib.regroup_engine_free(engine)
    assert directive["kind"] == "resume" and directive["dp"] == replicas, directive
    return directive["microbatches"]


def test_spread_matches_the_managers_rule():
    lib = _libregroup()
    if lib is None:
        pytest.skip("libregroup.so is not built (set $REGROUP_BIN_DIR, or build into build/): the "
                    "engine's spread is read through its C ABI")
    for microbatches, replicas in SPREAD_CASES:
        assert contract.spread(microbatches, replicas) == _resumed_spread(lib, microbatches, replicas), \
            (microbatches, replicas)


def test_a_replicas_range_is_its_slice_of_the_spread():
    assert contract.replica_range(8, 3, 2) == (6, 2)
    ranges = [contract.replica_range(13, 5, r) for r in range(5)]
    assert [b for b, _ in ranges] == [0, 3, 6, 9, 11] and sum(c for _, c in ranges) == 13
    assert contract.spread(2, 4) == [1, 1, 0, 0]  # more replicas than micro-batches: the last get none


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
