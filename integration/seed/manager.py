# SPDX-License-Identifier: Apache-2.0
# MindCluster's manager.py, as its documentation has users write it, with one change: the import
# line (`from taskd.api import init_taskd_manager, start_taskd_manager` before). Started on rank
# 0's pod by train_start.sh. It gives the job's id and sizes only: the manager learns the job's
# labels and annotations from the coordinator.
import os

from regroup.api import init_taskd_manager, start_taskd_manager

job_id = os.getenv("MINDX_TASK_ID")
node_nums = int(os.getenv("NNODES", "2"))          # the seed writes the numbers here
proc_per_node = int(os.getenv("NPROC_PER_NODE", "2"))

init_taskd_manager({"job_id": job_id, "node_nums": node_nums, "proc_per_node": proc_per_node})
start_taskd_manager()
