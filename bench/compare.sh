#!/usr/bin/env bash
# onceprint against BullMQ on Redis, side by side in one run.
#
#   bench/compare.sh                       # 50,000 tasks, 100 printers, 64 producers
#   bench/compare.sh --tasks 5000          # a quick look
#   bench/compare.sh --json-out cmp.json   # also the whole result as JSON
#   bench/compare.sh --batch 50            # 50 jobs per call: addBulk / POST /v1/print-task-batches
#   bench/compare.sh --database postgres://postgres@127.0.0.1:5432/test
#
# It builds target/release/onceprint when it is missing (or with --build), installs the
# pinned bullmq and ioredis of bench/compare/package-lock.json from the npm registry into a
# scratch folder (never into the repository), and runs bench/compare/compare.mjs, which
# starts a redis-server of its own on a free port. Every other option goes to the script:
# `bench/compare.sh --help` lists them. Needs node >= 20, npm and redis-server on PATH.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"

build=0
skip_onceprint=0
onceprint=""
pass=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=1 ;;
    --onceprint)
      [[ $# -ge 2 ]] || { echo "compare.sh: --onceprint needs a path" >&2; exit 2; }
      onceprint="$2"
      shift
      ;;
    --onceprint=*) onceprint="${1#--onceprint=}" ;;
    --skip-onceprint) skip_onceprint=1; pass+=("$1") ;;
    -h | --help)
      sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      echo "  --build            rebuild target/release/onceprint first"
      echo
      exec node "$here/compare/compare.mjs" --help
      ;;
    *) pass+=("$1") ;;
  esac
  shift
done

for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "compare.sh: $tool is not on PATH" >&2; exit 2; }
done

if [[ $skip_onceprint -eq 0 ]]; then
  if [[ -z "$onceprint" ]]; then
    target="${CARGO_TARGET_DIR:-$root/target}"
    onceprint="$target/release/onceprint"
    if [[ $build -eq 1 || ! -x "$onceprint" ]]; then
      echo "compare.sh: building $onceprint" >&2
      (cd "$root" && cargo build --release -p onceprint --locked)
    fi
  fi
  [[ -x "$onceprint" ]] || { echo "compare.sh: no onceprint binary at $onceprint" >&2; exit 2; }
  pass+=(--onceprint "$onceprint")
fi

# The scratch folder holds node_modules only; it goes away with the run.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/onceprint-compare-npm-XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
cp "$here/compare/package.json" "$here/compare/package-lock.json" "$scratch/"
echo "compare.sh: npm ci (bullmq, ioredis) into $scratch" >&2
# --ignore-scripts: no install script runs, so nothing is fetched from anywhere but the
# registry (msgpackr's native part comes as a prebuilt optional package of the registry).
(cd "$scratch" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)

node "$here/compare/compare.mjs" --modules "$scratch/node_modules" "${pass[@]}"
