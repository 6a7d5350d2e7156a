"""The generated wire messages match proto/regroup/v1/wire.proto."""

import hashlib

from regroup import _proto
from regroup._proto import wire_pb2 as pb


def test_the_generated_module_was_made_from_the_current_proto():
    root = _proto.proto_root()
    assert root is not None
    digest = hashlib.sha256((root / "regroup" / "v1" / "wire.proto").read_bytes()).hexdigest()
    assert _proto._STAMP.read_text().strip() == digest
    assert _proto.generate() is False  # current: nothing to do


def test_the_trainer_messages_have_the_fields_the_library_uses():
    fields = {name: {f.name for f in getattr(pb, name).DESCRIPTOR.fields} for name in
              ("TrainerHello", "TrainerHeartbeat", "TrainerVote", "TrainerFault", "TrainerAck",
               "StartGeneration", "GenerationPlan", "RankAssignment", "AbortGeneration", "StepOutcome",
               "StopTraining", "Pause")}
    assert {"local_rank", "pid", "epoch", "generation", "committed_step", "heard_commit_step"} <= fields["TrainerHello"]
    assert {"generation", "step", "ok", "checksum"} <= fields["TrainerVote"]
    assert {"store_host", "store_port", "committed_step", "microbatches_per_step", "tensor_parallel",
            "pipeline_parallel"} <= fields["GenerationPlan"]
    assert {"rank", "replica", "microbatch_begin", "microbatch_count"} <= fields["RankAssignment"]
    assert {"commit", "checksum_mismatch"} <= fields["StepOutcome"]
    assert pb.StopTraining.MODE_LEAVE == 4 and pb.PHASE_PAUSED == 7


def test_regenerating_gives_the_same_module():
    before = _proto._GENERATED.read_bytes()
    assert _proto.generate(force=True) is True
    assert _proto._GENERATED.read_bytes() == before
