#!/usr/bin/env bash
# Builds the real kube-apiserver, kube-scheduler and kube-controller-manager from the Go
# module k8s.io/kubernetes at a pinned version, plus etcd, into a cache directory outside
# the repository keyed by version. A warm cache is a no-op; a cold one builds once.
#
#   tests/cluster/build_k8s.sh            -> prints the bin directory on the last line
#   K8S_VERSION=v1.35.4 FLOWSCHED_CACHE=~/.cache/flowsched tests/cluster/build_k8s.sh
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.5.21}"
CACHE="${FLOWSCHED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flowsched}"
# RECIPE changes whenever the way the binaries are built changes (flags, stamping), so a warm
# cache never serves binaries built the old way.
RECIPE=2
BIN="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-r$RECIPE/bin"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager)

have_all() {
  for b in "${BINARIES[@]}" etcd; do [ -x "$BIN/$b" ] || return 1; done
}
if have_all; then echo "$BIN"; exit 0; fi

# Two test sessions starting cold at once must not build into the same directories.
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
if have_all; then echo "$BIN"; exit 0; fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
work="$CACHE/build-$K8S_VERSION"
mkdir -p "$work" "$BIN"
cd "$work"

# Staging modules: every `k8s.io/X => ./staging/src/k8s.io/X` replace in kubernetes' own
# go.mod must become `k8s.io/X => k8s.io/X v0.Y.Z`, else `unknown revision v0.0.0`.
gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
staging_version="v0.${K8S_VERSION#v1.}"
{
  echo "module flowsched.local/k8sbuild"
  echo
  echo "go $(go env GOVERSION | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  grep -oE 'k8s\.io/[A-Za-z0-9._-]+ => \./staging/src/k8s\.io/[A-Za-z0-9._-]+' "$gomod" \
    | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}' | sort -u
  echo ")"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
echo "staging replaces: $(grep -c '=>' go.mod)" >&2
go mod tidy -e >&2 || true
go get "k8s.io/kubernetes@$K8S_VERSION" >&2
# Stamp the version as kubernetes' own build does (hack/lib/version.sh); otherwise /version
# and --version say v0.0.0-master.
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
for b in "${BINARIES[@]}"; do
  [ -x "$BIN/$b" ] && continue
  echo "building $b ..." >&2
  go build -trimpath -ldflags "-s -w$stamp" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2
  mv "$BIN/$b.tmp" "$BIN/$b"
done
if [ ! -x "$BIN/etcd" ]; then
  echo "building etcd $ETCD_VERSION ..." >&2
  etcdwork="$CACHE/build-etcd-$ETCD_VERSION"
  mkdir -p "$etcdwork"; cd "$etcdwork"
  [ -f go.mod ] || go mod init flowsched.local/etcdbuild >&2
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  mv "$BIN/etcd.tmp" "$BIN/etcd"
fi
echo "$BIN"
