#!/usr/bin/env bash
# Slurm epilog: unmounts the job's dyadfs and removes its cache and rendezvous directory. The
# same environment as slurm-prolog.sh names the paths.
set -uo pipefail
MOUNT=${DYADFS_MOUNT:-/dyad}
NVME=${DYADFS_NVME:-/nvme}
RDV=${DYADFS_RENDEZVOUS:-/lustre/scratch/dyadfs}/$SLURM_JOB_ID
fusermount3 -u "$MOUNT" || umount -l "$MOUNT"
rm -rf "$NVME/dyadfs-$SLURM_JOB_ID" "$RDV"
