#!/usr/bin/env bash
# Builds nsfleet's Debian package with goreleaser's nfpm: both binaries
# static, the agent's systemd unit and /etc/default file, completions for
# bash, zsh and fish, man pages generated from the commands' help, the
# README, docs and examples, the Grafana dashboard and Prometheus rules.
#   scripts/package.sh [-o DIR] [-v VERSION]     (default: dist/, 0.1.0~gitDATE.COMMIT)
# Then: apt install ./dist/nsfleet_VERSION_amd64.deb
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
nfpm=github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.48.0
out=dist version=""
while getopts "o:v:" o; do
	case $o in
	o) out=$OPTARG ;;
	v) version=$OPTARG ;;
	*) echo "usage: $0 [-o DIR] [-v VERSION]" >&2; exit 2 ;;
	esac
done
if [ -z "$version" ]; then
	version="0.1.0~git$(git log -1 --format=%cd --date=format:%Y%m%d).$(git rev-parse --short=12 HEAD)"
fi
case $version in [0-9]*) ;; *) echo "package: version $version must start with a digit (Debian)" >&2; exit 2 ;; esac
date=$(git log -1 --format=%cd --date=format:%Y-%m-%d)

# nfpm's contents name dist/stage/ (it expands no variables there).
STAGE=dist/stage
rm -rf "$STAGE"
trap 'rm -rf "$STAGE"' EXIT
export VERSION=$version
mkdir -p "$STAGE/bin" "$STAGE/man" "$STAGE/completions" "$out"

echo "package: building static binaries ($version)"
CGO_ENABLED=1 go build -buildvcs=auto -trimpath -tags osusergo,netgo \
	-ldflags "-extldflags=-static -X github.com/nsfleet/nsfleet/internal/version.Release=$version" \
	-o "$STAGE/bin/" ./cmd/nsfleet ./cmd/nsfleet-cluster ./cmd/nsfleet-lab
for b in nsfleet nsfleet-cluster nsfleet-lab; do
	if readelf -l "$STAGE/bin/$b" | grep -q INTERP; then
		echo "package: $b is not static (it names a dynamic loader)" >&2; exit 1
	fi
done

echo "package: completions and man pages"
# nsfleet's completion covers agent, cluster, sim and bench too: it asks
# nsfleet-cluster and nsfleet-lab for theirs.
"$STAGE/bin/nsfleet" completion bash >"$STAGE/completions/nsfleet.bash"
"$STAGE/bin/nsfleet" completion zsh >"$STAGE/completions/_nsfleet"
"$STAGE/bin/nsfleet" completion fish >"$STAGE/completions/nsfleet.fish"
go run ./internal/mangen -o "$STAGE/man" -version "$version" -date "$date"
gzip -9n "$STAGE"/man/*.1

echo "package: nfpm"
go run "$nfpm" package --config contrib/debian/nfpm.yaml --packager deb --target "$out/"
ls -l "$out"/nsfleet_"${version}"_amd64.deb
