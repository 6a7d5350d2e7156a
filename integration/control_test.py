# SPDX-License-Identifier: Apache-2.0
"""Fault commands: bad ones get a clear error naming what was wrong, and the cluster goes on."""

import json

from cluster import Cluster, JobSpec
from control import execute


def test_bad_commands_get_clear_errors(tmp_path):
    with Cluster(tmp_path, JobSpec(nodes=2), network="loopback", log=lambda m: None) as c:
        def error(line):
            return json.loads(execute(c, line))["error"]

        assert error("bogus") == "unknown command 'bogus'; try help"
        assert error("kill-node node-9") == "kill-node: no node 'node-9'; nodes: node-0, node-1"
        assert error("kill-node") == "wrong arguments for kill-node: (none)"
        assert error("start-pod one node-0") == "start-pod: invalid literal for int() with base 10: 'one'"
        assert error("cut node-1") == "cut: cannot cut node-1 off the network in loopback mode"
        assert execute(c, "") == ""
        assert "kill-node" in json.loads(execute(c, "help"))["ok"]
        assert json.loads(execute(c, "add-node")) == {"ok": {"node": "node-2"}}


def test_a_folder_holding_an_earlier_run_is_refused_naming_what_it_holds(tmp_path):
    """Its ledger would be read as the new run's: a demo run twice in one --workdir killed its
    trainer at once, waiting for a step the old ledger held."""
    import pytest

    from regroup.api import UsageError

    (tmp_path / "ledger.jsonl").write_text('{"step": 81}\n')
    with pytest.raises(UsageError, match=r"holds an earlier run \(ledger.jsonl\): give a new or empty folder"):
        Cluster(tmp_path, JobSpec(nodes=2), network="loopback", log=lambda m: None)
