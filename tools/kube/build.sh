#!/usr/bin/env bash
# Builds the Kubernetes control plane the e2e tests run into a cache
# directory, once per machine: etcd, kube-apiserver, kube-controller-manager
# (this module's pins) and kwok with its stages file, and kube-scheduler, the
# baseline of the benchmarks (e2e/kube_bench_test.go). Prints that directory
# on its last line. A cold build takes tens of minutes on two cores; a second
# run finds the binaries and returns at once.
#
#   KUBE_BIN   where to put them (default: ~/.cache/toposched/kube-v1.36.3)
#
# Every build here uses the same flags and environment: a change to
# -trimpath, -gcflags or CGO_ENABLED recompiles everything, std included.
set -euo pipefail
cd "$(dirname "$0")"

K8S=v1.36.3
KWOK=v0.8.0
BIN=${KUBE_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/toposched/kube-$K8S}
mkdir -p "$BIN"
export CGO_ENABLED=0

# The version stamp: without it the server reports v0.0.0-master+$Format:%H$,
# which clients cannot parse.
LDF="-X k8s.io/component-base/version.gitVersion=$K8S -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
LDF="$LDF -X k8s.io/client-go/pkg/version.gitVersion=$K8S -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=36"

start=$(date +%s)
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-controller-manager" ] || [ ! -x "$BIN/etcd" ]; then
  echo "building etcd, kube-apiserver, kube-controller-manager $K8S into $BIN" >&2
  nice -n 10 go build -ldflags "$LDF" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager ./etcd
fi
if [ ! -x "$BIN/kube-scheduler" ]; then
  # Built on its own, so that adding it to a machine that has the rest
  # (about 25 s with a warm cache) does not write over binaries in use.
  echo "building kube-scheduler $K8S into $BIN" >&2
  nice -n 10 go build -ldflags "$LDF" -o "$BIN/" k8s.io/kubernetes/cmd/kube-scheduler
fi
if [ ! -x "$BIN/kwok" ]; then
  echo "building kwok $KWOK into $BIN" >&2
  # The module proxy's TLS handshake has timed out here once on the first
  # fetch and passed on the next (shared/howto/kubernetes): three tries.
  for try in 1 2 3; do
    if GOBIN="$BIN" nice -n 10 go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK"; then
      break
    fi
    [ "$try" = 3 ] && exit 1
    echo "kwok: try $try failed; again" >&2
  done
fi
if [ ! -f "$BIN/kwok-stages.yaml" ]; then
  # Without stages kwok exits with "no stages found": nodes become Ready,
  # pods bound to them Running, and deleted pods go away.
  st=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK/kustomize/stage
  { cat "$st/node/fast/node-initialize.yaml"; echo ---; cat "$st/pod/fast/pod-ready.yaml"; echo ---
    cat "$st/pod/fast/pod-complete.yaml"; echo ---; cat "$st/pod/fast/pod-delete.yaml"; } > "$BIN/kwok-stages.yaml.tmp"
  mv "$BIN/kwok-stages.yaml.tmp" "$BIN/kwok-stages.yaml"
fi
echo "kube control plane ready in $(( $(date +%s) - start )) s" >&2
echo "$BIN"
