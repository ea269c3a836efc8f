#!/usr/bin/env bash
# Checks a built edgeguard .deb against what the package must hold
# (packaging/deb/contents) and do: the policy is a conffile, the unit
# starts the packaged binary and there is a man page for every command
# that edgectl --help lists, the maintainer scripts enable and start
# nothing. Needs no root and installs nothing.
#
#   packaging/deb/check.sh edgeguard_VERSION_amd64.deb
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deb=${1:?usage: check.sh PACKAGE.deb}
fail=0
problem() { echo "check.sh: $deb: $*" >&2; fail=1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp/root"
dpkg-deb -e "$deb" "$tmp/DEBIAN"

# Files (not directories) in the package, as absolute paths.
mapfile -t files < <(cd "$tmp/root" && find . -type f -o -type l | sed 's#^\.##' | sort)
mapfile -t want < <(grep -v -e '^#' -e '^$' "$here/contents")
for f in "${files[@]}"; do
	ok=0
	for w in "${want[@]}"; do
		# shellcheck disable=SC2053 # w is a glob on purpose
		[[ $f == $w ]] && { ok=1; break; }
	done
	((ok)) || problem "unexpected file $f (not in packaging/deb/contents)"
done
for w in "${want[@]}"; do
	ok=0
	for f in "${files[@]}"; do
		# shellcheck disable=SC2053
		[[ $f == $w ]] && { ok=1; break; }
	done
	((ok)) || problem "missing $w"
done

# Owned by root, whoever built it.
if dpkg-deb -c "$deb" | awk '$2 != "root/root"' | grep -q .; then
	problem "files not owned by root/root: $(dpkg-deb -c "$deb" | awk '$2 != "root/root" {print $6}' | head -3)"
fi

[[ $(cat "$tmp/DEBIAN/conffiles") == /etc/edgeguard/edgeguard.yaml ]] ||
	problem "conffiles must list exactly /etc/edgeguard/edgeguard.yaml"
for field in Package Version Architecture Maintainer Description; do
	grep -q "^$field: " "$tmp/DEBIAN/control" || problem "control has no $field"
done
grep -qx 'Architecture: amd64' "$tmp/DEBIAN/control" || problem "architecture is not amd64"
ver=$(sed -n 's/^Version: //p' "$tmp/DEBIAN/control")
[[ $(basename "$deb") == "edgeguard_${ver}_amd64.deb" ]] || problem "file name does not match version $ver"

# Installing enables and starts nothing: no postinst, and no maintainer
# script that enables or starts a unit.
[[ ! -e $tmp/DEBIAN/postinst && ! -e $tmp/DEBIAN/preinst ]] || problem "has a preinst/postinst"
if grep -Eqs 'systemctl +(enable|start|restart|reload)|deb-systemd-(helper|invoke)' "$tmp"/DEBIAN/prerm "$tmp"/DEBIAN/postrm; then
	problem "a maintainer script enables or starts a unit"
fi

# The unit runs the packaged binary with the packaged policy and keeps
# its state in StateDirectory= when the unit in the tree does.
unit=$tmp/root/usr/lib/systemd/system/edgeguard.service
exec_bin=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
[[ $exec_bin == /usr/bin/edgectl ]] || problem "unit's ExecStart runs $exec_bin, not /usr/bin/edgectl"
grep -q -- '--config /etc/edgeguard/edgeguard.yaml' "$unit" || problem "unit does not run /etc/edgeguard/edgeguard.yaml"
if grep -q '^StateDirectory=' "$here/../../deploy/systemd/edgeguard.service" 2>/dev/null; then
	grep -q '^StateDirectory=' "$unit" || problem "unit lost StateDirectory="
fi
grep -q '^\[Install\]' "$unit" || problem "unit has no [Install] section"

# A static binary that runs, and a man page for every command it lists.
bin=$tmp/root/usr/bin/edgectl
if grep -qa 'ld-linux-x86-64\.so' "$bin"; then
	problem "edgectl is dynamically linked"
fi
"$bin" version >/dev/null || problem "edgectl version fails"
# The binary says which commit it was built from and when (build.sh stamps
# them): 'edgectl version' from the package is what a bug report quotes.
vjson=$("$bin" version --json 2>/dev/null || true)
grep -Eq '"commit": "[0-9a-f]{40}"' <<<"$vjson" || problem "edgectl version has no commit stamped: $vjson"
grep -Eq '"date": "[0-9]{4}-' <<<"$vjson" || problem "edgectl version has no commit date stamped: $vjson"
grep -q "\"version\": \"$ver\"" <<<"$vjson" || problem "edgectl version is not the package's $ver: $vjson"
mapfile -t cmds < <("$bin" --help | awk '/^Available Commands:/{on=1; next} on && /^$/{on=0} on {print $1}')
((${#cmds[@]} > 5)) || problem "edgectl --help lists ${#cmds[@]} commands"
for c in "${cmds[@]}"; do
	[[ $c == help ]] && continue
	[[ -s $tmp/root/usr/share/man/man1/edgectl-$c.1.gz ]] || problem "no man page for 'edgectl $c'"
done
zcat "$tmp/root/usr/share/man/man1/edgectl-run.1.gz" | grep -q -- '--iface' || problem "edgectl-run.1 does not describe --iface"
grep -q '__start_edgectl' "$tmp/root/usr/share/bash-completion/completions/edgectl" || problem "bash completion is not edgectl's"
grep -q '^#compdef edgectl' "$tmp/root/usr/share/zsh/vendor-completions/_edgectl" || problem "zsh completion is not edgectl's"
grep -q 'complete -c edgectl' "$tmp/root/usr/share/fish/vendor_completions.d/edgectl.fish" || problem "fish completion is not edgectl's"
cmp -s "$tmp/root/etc/edgeguard/edgeguard.yaml" "$here/../../examples/edgeguard.yaml" ||
	problem "/etc/edgeguard/edgeguard.yaml is not examples/edgeguard.yaml"

if ((fail)); then
	exit 1
fi
echo "check.sh: $(basename "$deb"): ${#files[@]} files as listed"
