#!/usr/bin/env bash
# Kernel matrix: boots each of Debian's packaged cloud kernels under QEMU
# with a small initramfs (busybox, the kernel's own veth module, static
# test binaries built here) and runs inside each the verifier probe
# (scripts/kernel-matrix/progstat: are the committed BPF objects accepted,
# with how many instructions; the SYN path's object where its probe passes), the loader tests (BPF_PROG_TEST_RUN:
# verdicts, rate limits, the differential test against the reference
# model) and one netns flood scenario with the real daemon. Prints one
# table row per kernel; docs/operations.md ("Kernel matrix") has the last
# table, docs/kernel-matrix.txt the last full output.
#
#   sudo scripts/kernel-matrix.sh                      # the default kernels, then print the table
#   sudo scripts/kernel-matrix.sh --update-docs        # also write docs/kernel-matrix.txt and the table
#   sudo KERNELS="linux-image-6.1.0-57-cloud-amd64" scripts/kernel-matrix.sh
#
# KERNELS: Debian package names; default: the newest linux-image-6.1.0-*-cloud-amd64
# (Debian 12's kernel) and the newest linux-image-6.12.*-cloud-amd64 that apt
# offers. When the host's apt sources have neither (not a Debian 12 host),
# a private apt directory with bookworm's sources is used; the host's
# sources and package lists are not changed. The packages are fetched with
# apt-get download into CACHE and unpacked with dpkg-deb -x: nothing is
# installed on the host.
# ACCEL: auto (default: KVM when a guest reaches the initramfs within
# KVM_PROBE seconds, else TCG), kvm or tcg. Nested KVM guests hang at boot
# on some hosts; TCG (-cpu max) is slow but always works.
# Each step in the guest is bounded by STEP_TIMEOUT seconds, the whole guest
# by GUEST_TIMEOUT seconds.
#
# Needs: go, qemu-system-x86_64, busybox (static), dpkg-deb, apt-get; as
# root it installs qemu-system-x86 and busybox-static when missing. The VM
# has no network device: the flood stays inside its namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export PATH="$PATH:/usr/local/go/bin"

update_docs=0
for a in "$@"; do
	case $a in
	--update-docs) update_docs=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "kernel-matrix: unknown argument $a (see --help)" >&2
		exit 2
		;;
	esac
done

CACHE=${CACHE:-/var/tmp/edgeguard-kernel-matrix}
ACCEL=${ACCEL:-auto}
KVM_PROBE=${KVM_PROBE:-30}
STEP_TIMEOUT=${STEP_TIMEOUT:-1200}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-3000}
LOADER_RUN=${LOADER_RUN:-.}
SCENARIO=${SCENARIO:-^TestKernelMatrixScenario\$}
MEM=${MEM:-2048}
TCG_TIME_SCALE=${TCG_TIME_SCALE:-10}
# veth for the testbed; the netlink library opens xfrm and netfilter
# netlink sockets beside the route one, and fails without them.
MODULES=${MODULES:-veth xfrm_user nfnetlink}
log() { echo "kernel-matrix: $*" >&2; }

# Tools only the matrix needs are installed here, not by install-deps.sh.
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
# The initramfs has no libc: its busybox must be the static one.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need_pkgs+=(busybox-static)
if ((${#need_pkgs[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		log "missing ${need_pkgs[*]}: install them (apt-get install ${need_pkgs[*]}) or run as root"
		exit 1
	fi
	log "installing ${need_pkgs[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
applets=$(/bin/busybox --list)
for applet in insmod cpio unxz nsenter timeout; do
	grep -qx "$applet" <<<"$applets" || { log "/bin/busybox has no $applet"; exit 1; }
done
for cmd in go dpkg-deb apt-get gzip timeout; do
	command -v "$cmd" >/dev/null || { log "missing $cmd"; exit 1; }
done

work=$(mktemp -d)
qemu_pid=
cleanup() {
	[[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$CACHE/debs"

# apt_private sets up apt options for a private directory with bookworm's
# sources (for a host whose own sources lack Debian 12's kernels).
apt_opts=()
apt_private() {
	local d=$CACHE/apt
	if [[ ! -e /usr/share/keyrings/debian-archive-keyring.gpg ]]; then
		# Ubuntu has Debian's keys as a package too.
		[[ $(id -u) -eq 0 ]] || { log "missing Debian's archive keys: apt-get install debian-archive-keyring"; exit 1; }
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debian-archive-keyring >/dev/null
	fi
	mkdir -p "$d/lists/partial" "$d/archives/partial" "$d/etc/preferences.d"
	cat >"$d/etc/sources.list" <<-EOF
		deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
		deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
		deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
	EOF
	apt_opts=(-o "Dir::Etc::SourceList=$d/etc/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
		-o "Dir::Etc::Preferences=$d/etc/preferences" -o "Dir::Etc::PreferencesParts=$d/etc/preferences.d"
		-o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives"
		-o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Architecture=amd64")
	log "private apt directory $d (bookworm); the host's sources are not changed"
	apt-get "${apt_opts[@]}" update -qq
}

newest() { # regex: the newest package name matching it
	apt-cache "${apt_opts[@]}" search --names-only "$1" | awk '{print $1}' | sort -V | tail -n 1
}

if [[ -z ${KERNELS:-} ]]; then
	k61=$(newest '^linux-image-6\.1\.0-[0-9]+-cloud-amd64$')
	k612=$(newest '^linux-image-6\.12\.[0-9]+\+deb[0-9]+-cloud-amd64$')
	if [[ -z $k61 ]]; then
		apt_private
		k61=$(newest '^linux-image-6\.1\.0-[0-9]+-cloud-amd64$')
		[[ -n $k612 ]] || k612=$(newest '^linux-image-6\.12\.[0-9]+\+deb[0-9]+-cloud-amd64$')
	fi
	KERNELS="$k61 $k612"
fi
read -r -a kernels <<<"$KERNELS"
((${#kernels[@]})) || { log "no kernel packages found"; exit 1; }
log "kernels: ${kernels[*]}"

# Static binaries (no libc in the initramfs), built once for every kernel.
log "building the test binaries (static)"
bin=$work/bin
mkdir -p "$bin"
export CGO_ENABLED=0
go build -trimpath -o "$bin/edgectl" ./cmd/edgectl
go build -trimpath -o "$bin/progstat" ./scripts/kernel-matrix/progstat
go test -trimpath -c -o "$bin/loader.test" ./internal/loader
go test -trimpath -c -o "$bin/netns.test" ./test/netns
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
objsum=$(sha256sum internal/loader/*_bpfel.o | sha256sum | cut -c1-12)

# module_deps FILE: the modules a .ko needs (its modinfo "depends=").
module_deps() {
	local f=$1
	if [[ $f == *.xz ]]; then
		/bin/busybox unxz -c "$f"
	else
		cat "$f"
	fi | tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '
}

# initramfs KERNEL_ROOT OUT: busybox, /init, the binaries and MODULES with
# the modules they depend on, in load order.
initramfs() {
	local kroot=$1 out=$2 ird=$work/initramfs
	rm -rf "$ird"
	mkdir -p "$ird"/{bin,proc,sys,dev,tmp,run,matrix/modules}
	cp /bin/busybox "$ird/bin/busybox"
	cp scripts/kernel-matrix/init.sh "$ird/init"
	chmod 0755 "$ird/init"
	cp "$bin"/* "$ird/matrix/"
	local moddir
	moddir=$(echo "$kroot"/lib/modules/*)
	local -a order=()
	local -A done_=()
	add_module() {
		local name=$1 f
		[[ -n ${done_[$name]:-} ]] && return 0
		done_[$name]=1
		f=$(find "$moddir/kernel" -name "$name.ko" -o -name "$name.ko.xz" | head -n 1)
		if [[ -z $f ]]; then
			# Built in (or absent: the tests then say what is missing).
			return 0
		fi
		local d
		for d in $(module_deps "$f"); do
			add_module "$d"
		done
		if [[ $f == *.xz ]]; then
			/bin/busybox unxz -c "$f" >"$ird/matrix/modules/$name.ko"
		else
			cp "$f" "$ird/matrix/modules/$name.ko"
		fi
		order+=("$name.ko")
	}
	local m
	for m in $MODULES; do
		add_module "$m"
	done
	printf '%s\n' "${order[@]}" >"$ird/matrix/modules.order"
	(cd "$ird" && find . | /bin/busybox cpio -o -H newc 2>/dev/null) | gzip -1 >"$out"
}

# boot ACCEL VMLINUZ INITRD LOG: runs the guest to its end (or timeout).
boot() {
	local accel=$1 kernel=$2 initrd=$3 out=$4 limit=$5 cpu scale
	# The daemon's start and stop deadlines in internal/testbed are
	# stretched under TCG (EDGEGUARD_TEST_TIME_SCALE).
	if [[ $accel == kvm ]]; then cpu=host scale=1; else cpu=max scale=$TCG_TIME_SCALE; fi
	: >"$out"
	qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -m "$MEM" -smp 2 -nographic -no-reboot \
		-nic none -kernel "$kernel" -initrd "$initrd" -serial "file:$out" -monitor none -display none \
		-append "console=ttyS0 panic=-1 quiet eg_step_timeout=$STEP_TIMEOUT eg_loader_run=$LOADER_RUN eg_scenario=$SCENARIO eg_time_scale=$scale" \
		</dev/null >/dev/null 2>&1 &
	qemu_pid=$!
	local waited=0
	while kill -0 "$qemu_pid" 2>/dev/null; do
		if [[ $accel == kvm && $waited -ge $KVM_PROBE ]] && ! grep -q '^EGKM begin' "$out"; then
			kill "$qemu_pid" 2>/dev/null || true
			wait "$qemu_pid" 2>/dev/null || true
			qemu_pid=
			return 1
		fi
		if ((waited >= limit)); then
			log "guest still running after ${limit}s: stopped"
			kill "$qemu_pid" 2>/dev/null || true
			break
		fi
		sleep 2
		waited=$((waited + 2))
	done
	wait "$qemu_pid" 2>/dev/null || true
	qemu_pid=
	# A KVM guest that QEMU could not start at all counts as not booted.
	[[ $accel != kvm ]] || grep -q '^EGKM begin' "$out"
}

field() { # LINE KEY: value of key=value in LINE
	sed -n "s/.*[ ]$2=\([^ ]*\).*/\1/p" <<<"$1"
}

# The guests' whole console logs stay in CACHE/logs for a look after.
results=$CACHE/logs
mkdir -p "$results"
rows=()
for pkg in "${kernels[@]}"; do
	deb=$(find "$CACHE/debs" -name "${pkg}_*.deb" | sort -V | tail -n 1)
	if [[ -z $deb ]]; then
		log "apt-get download $pkg"
		(cd "$CACHE/debs" && apt-get "${apt_opts[@]}" download -qq "$pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
		deb=$(find "$CACHE/debs" -name "${pkg}_*.deb" | sort -V | tail -n 1)
		[[ -n $deb ]] || { log "could not download $pkg"; exit 1; }
	fi
	version=$(dpkg-deb -f "$deb" Version)
	kroot=$work/k-$pkg
	dpkg-deb -x "$deb" "$kroot"
	vmlinuz=$(echo "$kroot"/boot/vmlinuz-*)
	initrd=$work/initrd-$pkg.gz
	initramfs "$kroot" "$initrd"
	out=$results/$pkg.log
	accel=$ACCEL
	if [[ $accel == auto ]]; then
		accel=tcg
		if [[ -w /dev/kvm ]]; then
			log "$pkg: trying KVM (${KVM_PROBE}s to reach the initramfs)"
			if boot kvm "$vmlinuz" "$initrd" "$out" "$GUEST_TIMEOUT"; then
				accel=kvm
			else
				log "$pkg: the KVM guest did not reach the initramfs; TCG"
			fi
		fi
	fi
	start=$(date +%s)
	if [[ $accel != kvm || ! -s $out ]]; then
		log "$pkg: booting under $accel"
		boot "$accel" "$vmlinuz" "$initrd" "$out" "$GUEST_TIMEOUT" || true
	fi
	secs=$(($(date +%s) - start))
	rm -rf "$kroot"

	# One row from the guest's EGKM lines.
	egkm=$(tr -d '\r' <"$out" | grep -a '^EGKM ' || true)
	uname=$(sed -n 's/^EGKM kernel //p' <<<"$egkm")
	prog_out=$(sed -n 's/^EGKM out progstat | //p' <<<"$egkm")
	ver_line=$(grep -m1 '^EGKM verifier object=limiter ' <<<"$prog_out" || true)
	if [[ $ver_line == *result=accepted* ]]; then
		verifier="accepted: $(field "$ver_line" insns) insns, $(field "$ver_line" xlated) xlated, $(field "$ver_line" verified) processed"
	elif [[ -n $ver_line ]]; then
		verifier="REJECTED ($( (grep '^EGKM verifier-log' <<<"$prog_out" || true) | tail -n 2 | sed 's/^EGKM verifier-log //' | tr '\n' ' '))"
	else
		verifier="no result (guest log: $out)"
	fi
	# The SYN path: its own object, loaded only after its probe passed
	# (Linux >= 6.9); one line per program, or one "unavailable" line.
	syn_lines=$(grep '^EGKM verifier object=syncookie ' <<<"$prog_out" || true)
	if [[ $syn_lines == *result=unavailable* ]]; then
		# The probe's reason, up to its first ";".
		why=$(sed -n 's/^EGKM verifier-why //p' <<<"$prog_out" | head -n 1 | cut -d';' -f1)
		synres="unavailable, as designed (${why:-no reason given})"
	elif [[ $syn_lines == *result=accepted* ]]; then
		synres=$(while read -r l; do
			echo "$(field "$l" program): $(field "$l" insns) insns, $(field "$l" verified) processed"
		done <<<"$syn_lines" | paste -sd ';' | sed 's/;/; /g')
		synres="accepted: $synres"
	elif [[ $syn_lines == *result=rejected* ]]; then
		synres="REJECTED ($( (grep '^EGKM verifier-log' <<<"$prog_out" || true) | tail -n 2 | sed 's/^EGKM verifier-log //' | tr '\n' ' '))"
	else
		synres="no result"
	fi
	loader_out=$(sed -n 's/^EGKM out loader | //p' <<<"$egkm")
	lpass=$(grep -c '^--- PASS' <<<"$loader_out" || true)
	lfail=$(grep -c '^--- FAIL' <<<"$loader_out" || true)
	lskip=$(grep -c '^--- SKIP' <<<"$loader_out" || true)
	lrc=$(sed -n 's/^EGKM step loader rc=\([0-9]*\).*/\1/p' <<<"$egkm")
	failed_names=$( (grep '^--- FAIL' <<<"$loader_out" || true) | awk '{print $3}' | tr '\n' ' ' | sed 's/ $//')
	loader="$lpass passed, $lfail failed, $lskip skipped (rc ${lrc:-none})"
	[[ -n $failed_names ]] && loader+=": $failed_names"
	sc_out=$(sed -n 's/^EGKM out scenario | //p' <<<"$egkm")
	src=$(sed -n 's/^EGKM step scenario rc=\([0-9]*\).*/\1/p' <<<"$egkm")
	# The scenario's own report: offered, passed and dropped by the daemon's counters.
	report=$(grep -m1 -E '^    Test[^:]*: offered' <<<"$sc_out" | sed -E 's/^    [^:]*: //; s/; legit.*//' || true)
	if [[ $src == 0 ]]; then sres=pass; else sres="FAIL (rc ${src:-none})"; fi
	scenario="$sres: ${report:-no report}"
	row="| $pkg ($version) | ${uname:-?} | $accel, ${secs}s | $verifier | $synres | $loader | $scenario |"
	rows+=("$row")
	log "$row"
done

{
	echo "Kernel matrix, $(date -u +%Y-%m-%d) UTC, commit $commit, BPF objects sha256 $objsum (scripts/kernel-matrix.sh)"
	echo
	echo "| package | uname -r | accel, guest time | verifier: limiter (committed objects) | verifier: SYN path (syncookie object) | loader tests | netns scenario ($SCENARIO) |"
	echo "| --- | --- | --- | --- | --- | --- | --- |"
	printf '%s\n' "${rows[@]}"
} >"$work/table.md"
cat "$work/table.md"

if ((update_docs)); then
	{
		cat "$work/table.md"
		for pkg in "${kernels[@]}"; do
			echo
			echo "== $pkg: the guest's result lines"
			tr -d '\r' <"$results/$pkg.log" | grep -a '^EGKM ' | grep -v -E '^EGKM out (loader|scenario) \| (=== (RUN|PAUSE|CONT)|    [a-z_]+\.go:[0-9]+: )' || true
		done
	} >docs/kernel-matrix.txt
	# The table between the markers in docs/operations.md.
	awk -v table="$work/table.md" '
		/<!-- kernel-matrix:begin -->/ { print; while ((getline l < table) > 0) print l; skip = 1; next }
		/<!-- kernel-matrix:end -->/ { skip = 0 }
		!skip { print }
	' docs/operations.md >"$work/operations.md"
	cat "$work/operations.md" >docs/operations.md
	log "wrote docs/kernel-matrix.txt and the table in docs/operations.md"
fi
