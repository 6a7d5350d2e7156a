#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# MindCluster's scripts/train_start.sh, as its documentation has users write it: TaskD switched
# on by its variable, manager.py started on rank 0 with MASTER_ADDR set to the pod's IP, then
# torchrun. Nothing here names Regroup: the image has Regroup installed and its torchrun hands
# over to regroup-agent (python3 -m regroup.torchrun shim|install), which finds the manager at
# $MASTER_ADDR:9601.
#   train_start.sh SCRIPT ARGS...    (NNODES, NPROC_PER_NODE, RANK, MASTER_ADDR, POD_IP from the pod)
set -e
export TASKD_PROCESS_ENABLE=on
if [[ "${RANK}" == "0" ]]; then
  export MASTER_ADDR=${POD_IP}
  python3 "$(dirname "$0")/manager.py" &
fi
torchrun --nproc_per_node "${NPROC_PER_NODE}" --nnodes "${NNODES}" --node_rank "${RANK}" \
  --master_addr "${MASTER_ADDR}" --master_port 29500 "$@"
