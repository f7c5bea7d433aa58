# The slow shared file system of the benchmark scripts (sourced, not run): an ext4 image on a
# loop device mounted at DIR, whose reads are throttled with the cgroup v1 blkio controller.
# The calling shell joins the throttled cgroup, so every process it starts from then on (the
# daemons, the readers) shares one bandwidth, like the clients of a parallel file system.
# Writes are not throttled: cgroup v1 cannot throttle buffered writeback.

SLOWFS_DIR= SLOWFS_LOOP= SLOWFS_CG=

# slow_fs_start DIR SIZE READ_BPS [READ_IOPS]  (IOPS 0 or absent: no IOPS limit)
slow_fs_start() {
  SLOWFS_DIR=$1
  local size=$2 bps=$3 iops=${4:-0} dev
  mkdir -p "$SLOWFS_DIR"
  truncate -s "$size" "$SLOWFS_DIR.img"
  mkfs.ext4 -q -F "$SLOWFS_DIR.img"
  SLOWFS_LOOP=$(losetup -f --show "$SLOWFS_DIR.img")
  mount "$SLOWFS_LOOP" "$SLOWFS_DIR"
  dev=$(lsblk -dno MAJ:MIN "$SLOWFS_LOOP" | tr -d ' ')
  SLOWFS_CG=/sys/fs/cgroup/blkio/dyadfs-slow-fs-$$
  mkdir "$SLOWFS_CG"
  echo "$dev $bps" > "$SLOWFS_CG/blkio.throttle.read_bps_device"
  if [ "$iops" -gt 0 ]; then echo "$dev $iops" > "$SLOWFS_CG/blkio.throttle.read_iops_device"; fi
  echo $$ > "$SLOWFS_CG/cgroup.procs"
}

# Leaves the cgroup (once the daemons using the file system are unmounted), unmounts the file
# system, detaches the loop device and deletes the image. Safe to call when nothing was set up.
slow_fs_stop() {
  if [ -n "$SLOWFS_CG" ] && [ -d "$SLOWFS_CG" ]; then
    echo $$ > /sys/fs/cgroup/blkio/cgroup.procs
    sleep 1 # the unmounted daemons exit and leave the group
    rmdir "$SLOWFS_CG"
  fi
  if [ -n "$SLOWFS_DIR" ]; then
    mountpoint -q "$SLOWFS_DIR" && umount "$SLOWFS_DIR"
    rm -f "$SLOWFS_DIR.img"
  fi
  if [ -n "$SLOWFS_LOOP" ]; then losetup -d "$SLOWFS_LOOP"; fi
}
