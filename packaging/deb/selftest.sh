#!/usr/bin/env bash
# Shows that packaging/deb/check.sh can fail: it must refuse copies of a
# good package with one defect each (CI runs this after check.sh passed).
#
#   packaging/deb/selftest.sh edgeguard_VERSION_amd64.deb
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
deb=${1:?usage: selftest.sh PACKAGE.deb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
name=$(basename "$deb")
defects=(
	"a stray file:touch R/usr/share/edgeguard/stray"
	"no zsh completion:rm R/usr/share/zsh/vendor-completions/_edgectl"
	"a postinst that starts the unit:printf '#!/bin/sh\nsystemctl enable --now edgeguard\n' >R/DEBIAN/postinst; chmod 755 R/DEBIAN/postinst"
	"a unit that runs another binary:sed -i 's#^ExecStart=/usr/bin/edgectl#ExecStart=/usr/local/bin/edgectl#' R/usr/lib/systemd/system/edgeguard.service"
	"no conffile:: >R/DEBIAN/conffiles"
)
fail=0
# The repacking alone must not be what check.sh refuses.
mkdir -p "$tmp/out"
dpkg-deb -R "$deb" "$tmp/R"
dpkg-deb --root-owner-group -b "$tmp/R" "$tmp/out/$name" >/dev/null
bash "$here/check.sh" "$tmp/out/$name" >/dev/null || { echo "selftest.sh: check.sh refused the repacked good package" >&2; exit 1; }
for d in "${defects[@]}"; do
	what=${d%%:*} how=${d#*:}
	rm -rf "$tmp/R" "$tmp/out"
	mkdir -p "$tmp/out"
	dpkg-deb -R "$deb" "$tmp/R"
	(cd "$tmp" && eval "$how")
	dpkg-deb --root-owner-group -b "$tmp/R" "$tmp/out/$name" >/dev/null
	if bash "$here/check.sh" "$tmp/out/$name" >/dev/null 2>&1; then
		echo "selftest.sh: check.sh accepted a package with $what" >&2
		fail=1
	fi
done
((fail == 0)) || exit 1
echo "selftest.sh: check.sh refused all ${#defects[@]} defective copies"
