#!/bin/busybox sh
# PID 1 of the kernel-matrix guest (tests/kernel/kernel_matrix.py packs it as /init). Reports on the serial
# console as `RESULT {json}` lines, one per check, then powers off; the host parses the lines.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=0755 tmpfs /run
# The spool: a tmpfs big enough for a 1 GiB core next to the 1 GiB process that dumps it.
mkdir -p /spool /var/lib/corehandler
mount -t tmpfs -o mode=0700,size=90% tmpfs /spool
# The kernel holds the crashed process until the handler exits: the hold time is the whole capture.
echo 16 > /proc/sys/kernel/core_pipe_limit

/bin/guest boot
/bin/guest kallsyms
/bin/guest probe
while read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    # shellcheck disable=SC2086  # the plan's fields are the arguments
    /bin/guest case $line
done < /plan
echo 'RESULT {"case":"done","ok":true}'
sync
reboot -f
