#!/usr/bin/env bash
# Slurm prolog (runs as root on every node of a job before its tasks): mounts dyadfs for the
# job over node-local NVMe. Slurm sets SLURM_JOB_ID and SLURM_NODEID; the daemons meet in a
# rendezvous directory on the shared file system, which also holds the job secret the first
# daemon creates. Pair with slurm-epilog.sh. Warm the dataset from the job script, before
# training starts, with every node staging its share:
#   srun --ntasks-per-node=1 dyadfs warm /dyad --cluster
# Paths come from the environment (slurm.conf's PrologSlurmctld/Prolog environment, or set
# here), with these defaults:
#   DYADFS_DATASET     the dataset on the shared FS; `managed` (or empty) mounts a managed
#                      directory instead (no dataset: what the job's producers write)
#   DYADFS_MOUNT       the mount point (/dyad)
#   DYADFS_NVME        the node-local NVMe the cache lives on (/nvme)
#   DYADFS_RENDEZVOUS  the shared directory the jobs' rendezvous directories go in
#                      (/lustre/scratch/dyadfs)
#   DYADFS_PORT        the control port (7450)
#   DYADFS_BIN         the dyadfs command (`dyadfs`: `dyadfs install` links it on PATH)
set -euo pipefail
DATASET=${DYADFS_DATASET-/lustre/datasets/imagenet}
MOUNT=${DYADFS_MOUNT:-/dyad}
NVME=${DYADFS_NVME:-/nvme}
RDV=${DYADFS_RENDEZVOUS:-/lustre/scratch/dyadfs}/$SLURM_JOB_ID
DYADFS=${DYADFS_BIN:-dyadfs}
# The address the other nodes reach this one at (the high-speed network's, in practice).
ADDR=$(hostname -i | awk '{print $1}'):${DYADFS_PORT:-7450}
mkdir -p "$MOUNT" "$(dirname "$RDV")"
# The rendezvous directory is private to the job (it holds the job's secret): 0700.
install -d -m 0700 "$RDV"
BACKING=()
if [ -n "$DATASET" ] && [ "$DATASET" != managed ]; then BACKING=(--backing "$DATASET"); fi
"$DYADFS" mount "$MOUNT" --ssd "$NVME/dyadfs-$SLURM_JOB_ID" "${BACKING[@]}" \
  --rendezvous "$RDV" --nodes "$SLURM_JOB_NUM_NODES" --node-id "$SLURM_NODEID" \
  --listen "$ADDR" -o allow_other
