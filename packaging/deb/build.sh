#!/usr/bin/env bash
# Builds the Debian package edgeguard_<version>_amd64.deb with dpkg-deb
# (make deb). What it holds is listed in packaging/deb/contents and checked
# by packaging/deb/check.sh. Installing it enables and starts nothing.
#
#   packaging/deb/build.sh [OUTDIR]      # default OUTDIR: the repository root
#
# VERSION overrides the package version (default: from the newest v* tag,
# else 0.0.0~git<commit time>.<commit>, so every commit orders after the one
# before it and before any release).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:-.}")
mkdir -p "$out"
export PATH="$PATH:/usr/local/go/bin"

for cmd in go dpkg-deb gzip git; do
	command -v "$cmd" >/dev/null || { echo "packaging/deb/build.sh: missing $cmd" >&2; exit 1; }
done

if [[ -z ${VERSION:-} ]]; then
	if tag=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
		# v1.2.0-3-gabc1234 -> 1.2.0+3.gabc1234
		VERSION=$(sed -E 's/^v//; s/-([0-9]+)-g/+\1.g/' <<<"$tag")
	else
		VERSION="0.0.0~git$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y%m%d%H%M%S).$(git rev-parse --short=7 HEAD)"
	fi
fi
if ! [[ $VERSION =~ ^[0-9][A-Za-z0-9.+~-]*$ ]]; then
	echo "packaging/deb/build.sh: version $VERSION is not a Debian version (must start with a digit)" >&2
	exit 1
fi
# Man pages carry the commit's date, not today's, so two builds of one
# commit give the same pages.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
gen=$stage/gen

# A static binary: the package depends on nothing but the kernel. It is
# stamped with the version, the commit and the commit's date (as make
# build does): with -buildvcs=false in GOFLAGS, or -trimpath builds outside
# a checkout, the toolchain would record none of them.
commit=$(git rev-parse HEAD)
date=$(git log -1 --format=%cI)
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath \
	-ldflags "-s -w -X main.version=$VERSION -X main.commit=$commit -X main.date=$date" -o "$stage/edgectl" ./cmd/edgectl
"$stage/edgectl" gendocs "$gen"

install -D -m 0755 "$stage/edgectl" "$root/usr/bin/edgectl"

# The unit from the tree, with the paths of a packaged install: the
# binary in /usr/bin and the docs in /usr/share/doc (the file itself is
# written for a copy into /usr/local). Nothing else in it is changed.
install -d "$root/usr/lib/systemd/system"
sed -e 's#/usr/local/bin/edgectl#/usr/bin/edgectl#g' \
	-e 's#/usr/local/share/doc/edgeguard#/usr/share/doc/edgeguard#g' \
	deploy/systemd/edgeguard.service >"$root/usr/lib/systemd/system/edgeguard.service"
chmod 0644 "$root/usr/lib/systemd/system/edgeguard.service"

install -D -m 0644 examples/edgeguard.yaml "$root/etc/edgeguard/edgeguard.yaml"
install -D -m 0644 deploy/grafana/edgeguard.json "$root/usr/share/edgeguard/grafana/edgeguard.json"
install -D -m 0644 deploy/prometheus/alerts.yml "$root/usr/share/edgeguard/prometheus/alerts.yml"

install -d "$root/usr/share/man/man1"
for page in "$gen"/man1/*.1; do
	gzip -9n <"$page" >"$root/usr/share/man/man1/$(basename "$page").gz"
done
install -D -m 0644 "$gen/completions/edgectl.bash" "$root/usr/share/bash-completion/completions/edgectl"
install -D -m 0644 "$gen/completions/_edgectl" "$root/usr/share/zsh/vendor-completions/_edgectl"
install -D -m 0644 "$gen/completions/edgectl.fish" "$root/usr/share/fish/vendor_completions.d/edgectl.fish"

install -d "$root/usr/share/doc/edgeguard"
install -m 0644 README.md "$root/usr/share/doc/edgeguard/README.md"
for f in docs/*.md; do
	gzip -9n <"$f" >"$root/usr/share/doc/edgeguard/$(basename "$f").gz"
done

install -d "$root/DEBIAN"
install -m 0644 packaging/deb/conffiles "$root/DEBIAN/conffiles"
install -m 0755 packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$VERSION/" -e "s/@SIZE@/$size/" packaging/deb/control.in >"$root/DEBIAN/control"

# Every file root:root, whoever builds; timestamps from the commit.
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb="$out/edgeguard_${VERSION}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
