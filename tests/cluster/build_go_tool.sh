#!/usr/bin/env bash
# Builds a real tool the tests run (prometheus, helm) from its Go module at a pinned version,
# into a cache directory outside the repository keyed by tool, version and recipe. A warm
# cache is a no-op; a cold one builds once (CGO off, so only Go is needed).
#
#   tests/cluster/build_go_tool.sh prometheus   -> prints the binary's path on the last line
#   tests/cluster/build_go_tool.sh helm
#   tests/cluster/build_go_tool.sh kustomize
#   PROMETHEUS_VERSION=v0.316.0 HELM_VERSION=v3.21.4 KUSTOMIZE_VERSION=v5.7.1 FLOWSCHED_CACHE=~/.cache/flowsched ...
#
# Prometheus is built without the `builtinassets` tag: the tests use its HTTP API only, so the
# npm-built web UI is not needed (its pages answer 404-ish errors; /api/v1 and /-/ready work).
set -euo pipefail

tool="${1:?usage: build_go_tool.sh prometheus|helm|kustomize}"
# Prometheus' Go module versions are v0.<major><minor>.<patch> for release v<major>.<minor>.<patch>:
# v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
HELM_VERSION="${HELM_VERSION:-v3.21.4}"
KUSTOMIZE_VERSION="${KUSTOMIZE_VERSION:-v5.7.1}"
CACHE="${FLOWSCHED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flowsched}"
# RECIPE changes whenever the way a binary is built changes, so a warm cache never serves
# binaries built the old way.
RECIPE=1

case "$tool" in
  prometheus)
    version="$PROMETHEUS_VERSION"
    module="github.com/prometheus/prometheus"
    pkg="$module/cmd/prometheus"
    # remove_all_sd: no service-discovery plugins (the tests use static targets only); it also
    # keeps the build off modules the proxy cannot serve (hashicorp/nomad/api's pseudo-version).
    tags="remove_all_sd"
    release="${version#v0.}"                                  # 316.0
    release="3.$((10#${release%%.*} - 300)).${release#*.}"     # 3.16.0
    ldflags="-X github.com/prometheus/common/version.Version=$release -X github.com/prometheus/common/version.Branch=release -X github.com/prometheus/common/version.Revision=$version"
    ;;
  helm)
    version="$HELM_VERSION"
    module="helm.sh/helm/v3"
    pkg="$module/cmd/helm"
    tags=""
    ldflags="-X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    ;;
  kustomize)
    # What `kubectl apply -k` runs: deploy/ and deploy/ha/ are checked as it renders them.
    version="$KUSTOMIZE_VERSION"
    module="sigs.k8s.io/kustomize/kustomize/v5"
    pkg="$module"
    tags=""
    ldflags="-X sigs.k8s.io/kustomize/api/provenance.version=$version"
    ;;
  *) echo "unknown tool: $tool (prometheus, helm or kustomize)" >&2; exit 2 ;;
esac

BIN="$CACHE/$tool-$version-r$RECIPE/bin"
if [ -x "$BIN/$tool" ]; then echo "$BIN/$tool"; exit 0; fi

command -v go >/dev/null 2>&1 || {
  echo "building $tool needs Go (https://go.dev/dl/, or: apt-get install -y golang-go if it is new enough)" >&2
  exit 3
}

# Two test sessions starting cold at once must not build into the same directory.
mkdir -p "$CACHE" "$BIN"
exec 9>"$CACHE/.build-$tool.lock"
flock 9
if [ -x "$BIN/$tool" ]; then echo "$BIN/$tool"; exit 0; fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
work="$CACHE/build-$tool-$version"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
# A throwaway module that requires the tool's module at the pinned version (neither module
# has replace directives, so this is the build `go install pkg@version` would do, with tags).
# `go get` of the module (not the package) fetches only what the tagged build imports.
go mod init "flowsched.local/${tool}build" >&2
go get "$module@$version" >&2
if [ "$tool" = helm ]; then
  # As helm's Makefile does: the default Kubernetes version (.Capabilities.KubeVersion, the
  # chart's kubeVersion check) follows the client-go it is built with, not v1.20.
  cg=$(go list -f '{{.Version}}' -m k8s.io/client-go)   # v0.35.1 -> 1.35
  cg_minor=$(echo "$cg" | cut -d. -f2)
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$cg_minor"
  done
fi
echo "building $tool $version (tags: ${tags:-none}) ..." >&2
go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$BIN/$tool.tmp" "$pkg" >&2
mv "$BIN/$tool.tmp" "$BIN/$tool"
cd /; rm -rf "$work"
echo "$BIN/$tool"
