#!/usr/bin/env bash
# Slurm epilog: unmounts the job's dyadfs and removes its cache and rendezvous directory.
set -uo pipefail
NVME=${DYADFS_NVME:-/nvme}
fusermount3 -u /dyad || umount -l /dyad
rm -rf "$NVME/dyadfs-$SLURM_JOB_ID" "/lustre/scratch/dyadfs/$SLURM_JOB_ID"
