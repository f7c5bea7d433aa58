#!/usr/bin/env bash
# Slurm prolog (runs as root on every node of a job before its tasks): mounts dyadfs for the
# job over node-local NVMe. Slurm sets SLURM_JOB_ID and SLURM_NODEID; the daemons meet in a
# rendezvous directory on the shared file system, which also holds the job secret the first
# daemon creates. Pair with slurm-epilog.sh. Warm the dataset from the job script, before
# training starts, with every node staging its share:
#   srun --ntasks-per-node=1 dyadfs warm /dyad --cluster
# DYADFS_DATASET=managed (or empty) mounts a managed directory instead (no dataset: what the
# job's producers write, read on every node).
set -euo pipefail
DATASET=${DYADFS_DATASET-/lustre/datasets/imagenet}
NVME=${DYADFS_NVME:-/nvme}
RDV=/lustre/scratch/dyadfs/$SLURM_JOB_ID
# The address the other nodes reach this one at (the high-speed network's, in practice).
ADDR=$(hostname -i | awk '{print $1}'):${DYADFS_PORT:-7450}
mkdir -p /dyad "$RDV"
BACKING=()
if [ -n "$DATASET" ] && [ "$DATASET" != managed ]; then BACKING=(--backing "$DATASET"); fi
dyadfs mount /dyad --ssd "$NVME/dyadfs-$SLURM_JOB_ID" "${BACKING[@]}" \
  --rendezvous "$RDV" --nodes "$SLURM_JOB_NUM_NODES" --node-id "$SLURM_NODEID" \
  --listen "$ADDR" -o allow_other
