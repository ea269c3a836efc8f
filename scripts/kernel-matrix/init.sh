#!/bin/busybox sh
# /init of the kernel matrix's initramfs (scripts/kernel-matrix.sh): mounts
# what the tests need, loads the modules shipped beside it, runs the
# verifier probe, the loader tests and one netns flood scenario, and writes
# every result as a line starting with "EGKM " on the console. Then powers
# off. Nothing here reaches outside the VM: it has no network device.
/bin/busybox --install -s /bin
export PATH=/bin:/matrix
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t bpf bpf /sys/fs/bpf
mkdir -p /var /run/netns
ln -sf /run /var/run
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ip link set lo up
# Go's runtime and the tests read these.
export HOME=/tmp TMPDIR=/tmp GOMAXPROCS=$(nproc)

echo "EGKM begin"
echo "EGKM kernel $(uname -r)"
echo "EGKM cpus $(nproc)"
for m in $(cat /matrix/modules.order 2>/dev/null); do
	insmod "/matrix/modules/$m" || echo "EGKM module-failed $m"
done

# Each step gets its own time bound (seconds), read from the kernel
# command line (eg_step_timeout=N).
limit=$(sed -n 's/.*eg_step_timeout=\([0-9]*\).*/\1/p' /proc/cmdline)
limit=${limit:-900}
tests=$(sed -n 's/.*eg_loader_run=\([^ ]*\).*/\1/p' /proc/cmdline)
scenario=$(sed -n 's/.*eg_scenario=\([^ ]*\).*/\1/p' /proc/cmdline)

step() { # name, command...: runs it, records the output and the exit code
	name=$1
	shift
	start=$(date +%s)
	timeout "$limit" "$@" >/tmp/$name.out 2>&1
	rc=$?
	end=$(date +%s)
	sed "s/^/EGKM out $name | /" /tmp/$name.out
	echo "EGKM step $name rc=$rc seconds=$((end - start))"
}

step progstat /matrix/progstat
step loader /matrix/loader.test -test.v -test.count=1 -test.run "${tests:-.}"
scale=$(sed -n 's/.*eg_time_scale=\([0-9]*\).*/\1/p' /proc/cmdline)
EDGECTL_BIN=/matrix/edgectl EDGEGUARD_TEST_TIME_SCALE=${scale:-1} step scenario /matrix/netns.test -test.v -test.count=1 -test.run "${scenario:-^TestKernelMatrixScenario\$}"
echo "EGKM end"
sync
poweroff -f
