#!/usr/bin/env bash
# Checks the unit files with systemd's own tools, without installing anything:
#   packaging/systemd/check-units.sh [BINARY]
# `systemd-analyze verify` insists that ExecStart's program exists, so the units are
# checked as copies whose ExecStart names BINARY (default: the dist build, else any
# executable given) instead of /usr/local/bin/onceprint. Then `systemd-analyze security`
# rates each unit's sandbox offline (lower is better; it does not start anything).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../target/dist/onceprint}
[ -x "$bin" ] || { echo "check-units: $bin is not an executable; give the binary's path" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in "$here"/*.service; do
  sed "s#/usr/local/bin/onceprint#$bin#g" "$unit" >"$tmp/$(basename "$unit")"
done
status=0
for unit in "$tmp"/*.service; do
  name=$(basename "$unit")
  echo "== systemd-analyze verify $name"
  # verify exits 0 on a misspelt key or a bad value and only logs it: any output counts.
  if out=$(systemd-analyze verify "$unit" 2>&1) && [ -z "$out" ]; then
    echo "   no complaints"
  else
    printf '%s\n' "$out"
    status=1
  fi
  echo "== systemd-analyze security --offline=true $name"
  systemd-analyze security --offline=true --no-pager "$unit" | tail -n 1
done
exit "$status"
