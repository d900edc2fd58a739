#!/usr/bin/env bash
# Runs the repository's Dockerfile without a Docker engine, in debootstrap chroots, to check
# that its steps work: the builder stage's RUN steps compile the binary, the runtime stage's
# RUN steps make the user and the volume directory, and the binary then starts the way the
# image's ENTRYPOINT and CMD would start it and passes the image's HEALTHCHECK.
#
#   sudo packaging/verify-dockerfile.sh [DIR]
#
# DIR holds the chroots; without it a temporary folder is used and removed at the end. With
# it, the pristine Debian tree and the build caches (the Dockerfile's cache mounts) are kept
# in DIR, so a second run skips debootstrap and most of the compile.
#
# What stands in for what:
# - `rust:*-slim-bookworm` is Debian bookworm (minbase) with ca-certificates, gcc and
#   libc6-dev, and the toolchain of the machine running this script, bind-mounted read-only
#   where the official image keeps it (RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=
#   /usr/local/cargo): rustup cannot download a toolchain everywhere this runs.
# - The cache mount of /usr/local/cargo/registry is an overlay whose lower layer is this
#   machine's crate registry cache (read-only); crates missing from it are fetched from the
#   crate registry into the overlay's upper layer, never into this machine's cache.
# - `debian:bookworm-slim` is Debian bookworm minbase.
# - The broker runs in a network namespace of its own with only a loopback interface, as in
#   a container without published ports: it cannot fetch anything, and it cannot collide
#   with a broker already listening on this machine's port 8080.
#
# Needs: root, debootstrap, unshare and ip (util-linux, iproute2), overlayfs, a reachable
# Debian mirror (MIRROR, default http://deb.debian.org/debian), and a Rust toolchain in
# RUSTUP_HOME/CARGO_HOME (default /root/.rustup and /root/.cargo). The compile runs under
# `nice -n ${VERIFY_NICE:-19}`. Not part of .ci/run: it takes many minutes.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DOCKERFILE="$REPO/Dockerfile"
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
HOST_RUSTUP=${RUSTUP_HOME:-/root/.rustup}
HOST_CARGO=${CARGO_HOME:-/root/.cargo}
NICE=${VERIFY_NICE:-19}

say() { printf '== %s\n' "$*"; }
die() { printf 'verify-dockerfile: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and mounts need it)"
for tool in debootstrap chroot unshare ip mount umount tar; do
  command -v "$tool" >/dev/null || die "$tool is missing (debootstrap: apt-get install debootstrap)"
done
[ -x "$HOST_CARGO/bin/cargo" ] || die "no cargo in $HOST_CARGO/bin"
[ -d "$HOST_RUSTUP/toolchains" ] || die "no toolchains in $HOST_RUSTUP"

if [ $# -ge 1 ]; then
  WORK=$(mkdir -p "$1" && cd "$1" && pwd)
  KEEP_WORK=1
else
  WORK=$(mktemp -d /var/tmp/onceprint-verify.XXXXXX)
  KEEP_WORK=0
fi
BASE="$WORK/base"        # pristine debootstrap tree, copied for every stage
CACHE="$WORK/cache"      # the Dockerfile's cache mounts
STAGES="$WORK/stages"    # one root per stage of this run
MOUNTS=()                # everything mounted, unmounted in reverse order on exit
BROKER_PID=""

cleanup() {
  local rc=$?
  set +e
  if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -TERM "$BROKER_PID"
    wait "$BROKER_PID" 2>/dev/null
  fi
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}"
  done
  # Never delete through a mount that is still there (a bind of /dev or of the toolchain).
  if grep -q " $WORK/" /proc/mounts; then
    echo "verify-dockerfile: mounts remain under $WORK; not deleting anything" >&2
    grep " $WORK/" /proc/mounts >&2
  else
    rm -rf --one-file-system "$STAGES"
    [ "$KEEP_WORK" = 1 ] || rm -rf --one-file-system "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mnt() { # mnt TARGET MOUNT-ARGS...
  local target=$1
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  MOUNTS+=("$target")
}

# ---- the base tree ----
if [ ! -e "$BASE/.debootstrap-done" ]; then
  say "debootstrap $SUITE (minbase) into $BASE"
  rm -rf --one-file-system "$BASE"
  debootstrap --variant=minbase "$SUITE" "$BASE" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  touch "$BASE/.debootstrap-done"
else
  say "reusing the Debian tree in $BASE"
fi
rm -rf --one-file-system "$STAGES"
mkdir -p "$STAGES" "$CACHE"

# ---- stage roots ----
declare -A STAGE_ROOT STAGE_ENV STAGE_USER STAGE_DIR
new_stage() { # new_stage NAME IMAGE
  local name=$1 image=$2 root="$STAGES/$1"
  say "stage $name: FROM $image"
  cp -a "$BASE" "$root"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  mnt "$root/proc" -t proc proc
  mnt "$root/dev" --bind /dev
  local path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  case "$image" in
    rust:*-slim-bookworm)
      chroot "$root" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ca-certificates gcc libc6-dev' \
        >"$WORK/$name-base.log" 2>&1 || { tail -n 20 "$WORK/$name-base.log" >&2; die "installing the rust image's packages failed"; }
      mnt "$root/usr/local/rustup" --bind -o ro "$HOST_RUSTUP"
      mount -o remount,bind,ro "$root/usr/local/rustup"
      mnt "$root/usr/local/cargo/bin" --bind -o ro "$HOST_CARGO/bin"
      mount -o remount,bind,ro "$root/usr/local/cargo/bin"
      STAGE_ENV[$name]="RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$path"
      ;;
    debian:bookworm-slim)
      STAGE_ENV[$name]="PATH=$path"
      ;;
    *) die "no stand-in for base image $image" ;;
  esac
  STAGE_ROOT[$name]=$root
  STAGE_USER[$name]=0:0
  STAGE_DIR[$name]=/
}

# A Dockerfile cache mount: the crate registry is an overlay on this machine's cache, any
# other target a directory of its own under $CACHE that later runs reuse.
cache_mount() { # cache_mount STAGE TARGET
  local root=${STAGE_ROOT[$1]} target=$2
  if grep -q " $root$target " /proc/mounts; then return; fi
  if [ "$target" = /usr/local/cargo/registry ]; then
    mkdir -p "$CACHE/registry-upper" "$CACHE/registry-work"
    mnt "$root$target" -t overlay overlay \
      -o "lowerdir=$HOST_CARGO/registry,upperdir=$CACHE/registry-upper,workdir=$CACHE/registry-work"
  else
    local dir="$CACHE/$(printf '%s' "$target" | tr / _)"
    mkdir -p "$dir"
    mnt "$root$target" --bind "$dir"
  fi
}

in_stage() { # in_stage STAGE COMMAND: /bin/sh -c COMMAND as the stage's user, in its WORKDIR
  local name=$1 cmd=$2
  # shellcheck disable=SC2086 # the stage's environment is a list of words on purpose
  chroot --userspec="${STAGE_USER[$name]}" "${STAGE_ROOT[$name]}" \
    /usr/bin/env -i HOME=/root ${STAGE_ENV[$name]} /bin/sh -c "cd '${STAGE_DIR[$name]}' && $cmd"
}

# COPY . DEST from the build context, leaving out what .dockerignore names (the patterns
# used there: NAME, NAME/, *.EXT and **/NAME/, anchored at the context's root).
copy_context() { # copy_context STAGE DEST
  local dest="${STAGE_ROOT[$1]}$2" excludes=() line
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    line=${line%"${line##*[![:space:]]}"}
    [ -n "$line" ] || continue
    line=${line%/}
    line=${line#/}
    case "$line" in
      '**/'*) excludes+=("--exclude=*/${line#'**/'}") ;;
      *) excludes+=("--exclude=./$line") ;;
    esac
  done <"$REPO/.dockerignore"
  mkdir -p "$dest"
  tar -C "$REPO" --anchored "${excludes[@]}" -cf - . | tar -C "$dest" -xf -
}

# ---- interpret the Dockerfile ----
# Only the instructions this Dockerfile uses are known; anything else stops the run, so a
# change to the Dockerfile that this script cannot follow is noticed.
declare -A ARGS
HEALTHCHECK_CMD="" ENTRYPOINT="" CMD="" VOLUMES="" EXPOSED="" STAGE="" LAST_STAGE=""

expand() { # ${NAME} and $NAME from ARG, as Docker substitutes them
  local s=$1 k
  for k in "${!ARGS[@]}"; do
    s=${s//\$\{$k\}/${ARGS[$k]}}
    s=${s//\$$k/${ARGS[$k]}}
  done
  printf '%s' "$s"
}

json_words() { # ["a", "b"] -> a b (no quotes or commas inside the strings)
  local s=$1
  s=${s#*[}
  s=${s%]*}
  s=${s//\"/}
  s=${s//,/ }
  printf '%s' "$s" | tr -s ' ' | sed 's/^ //; s/ $//'
}

run_instruction() { # run_instruction LINE (continuations already joined)
  local line=$1 word rest
  word=${line%%[[:space:]]*}
  rest=${line#"$word"}
  rest=${rest#"${rest%%[![:space:]]*}"}
  case "${word^^}" in
    ARG)
      local name=${rest%%=*} value=""
      [[ "$rest" == *=* ]] && value=${rest#*=}
      [ -n "${ARGS[$name]+set}" ] && [[ "$rest" != *=* ]] || ARGS[$name]=$value
      ;;
    FROM)
      local image name
      image=$(expand "${rest%% *}")
      name=${rest##* [Aa][Ss] }
      [ "$name" != "$rest" ] || die "FROM without AS NAME is not supported"
      new_stage "$name" "$image"
      STAGE=$name
      LAST_STAGE=$name
      ;;
    WORKDIR)
      STAGE_DIR[$STAGE]=$rest
      mkdir -p "${STAGE_ROOT[$STAGE]}$rest"
      say "$STAGE: WORKDIR $rest"
      ;;
    COPY)
      if [[ "$rest" == --from=* ]]; then
        local from=${rest%% *} src dst
        from=${from#--from=}
        read -r src dst <<<"${rest#* }"
        say "$STAGE: COPY --from=$from $src $dst"
        mkdir -p "$(dirname "${STAGE_ROOT[$STAGE]}$dst")"
        cp -a "${STAGE_ROOT[$from]}$src" "${STAGE_ROOT[$STAGE]}$dst"
      elif [ "$rest" = ". ." ]; then
        say "$STAGE: COPY . ${STAGE_DIR[$STAGE]} (honouring .dockerignore)"
        copy_context "$STAGE" "${STAGE_DIR[$STAGE]}"
      else
        die "COPY $rest: only 'COPY . .' and 'COPY --from=STAGE SRC DST' are supported"
      fi
      ;;
    RUN)
      local cmd=$rest
      while [[ "$cmd" == --mount=* ]]; do
        local opt=${cmd%% *} target
        cmd=${cmd#"$opt"}
        cmd=${cmd#"${cmd%%[![:space:]]*}"}
        [[ "$opt" == --mount=type=cache,* ]] || die "RUN $opt: only cache mounts are supported"
        target=${opt#*target=}
        target=${target%%,*}
        cache_mount "$STAGE" "$target"
      done
      say "$STAGE: RUN $cmd"
      local started=$SECONDS
      nice -n "$NICE" chroot --userspec="${STAGE_USER[$STAGE]}" "${STAGE_ROOT[$STAGE]}" \
        /usr/bin/env -i HOME=/root ${STAGE_ENV[$STAGE]} /bin/sh -c "cd '${STAGE_DIR[$STAGE]}' && $cmd" \
        || die "$STAGE: RUN failed"
      say "$STAGE: RUN took $((SECONDS - started)) s"
      ;;
    ENV)
      # KEY=VALUE pairs without spaces in the values (as this Dockerfile writes them).
      local pair
      for pair in $rest; do
        [[ "$pair" == *=* ]] || die "ENV $rest: only KEY=VALUE pairs are supported"
        STAGE_ENV[$STAGE]+=" $pair"
      done
      say "$STAGE: ENV $rest"
      ;;
    USER) STAGE_USER[$STAGE]=$rest ;;
    VOLUME) VOLUMES=$(json_words "$rest") ;;
    EXPOSE) EXPOSED=$rest ;;
    HEALTHCHECK)
      [[ "$rest" == *CMD* ]] || die "HEALTHCHECK without CMD"
      HEALTHCHECK_CMD=$(json_words "${rest#*CMD}")
      ;;
    ENTRYPOINT) ENTRYPOINT=$(json_words "$rest") ;;
    CMD) CMD=$(json_words "$rest") ;;
    *) die "Dockerfile instruction $word is not known to this script" ;;
  esac
}

say "interpreting $DOCKERFILE"
joined=""
while IFS= read -r raw || [ -n "$raw" ]; do
  [[ "$raw" =~ ^[[:space:]]*# ]] && continue
  if [[ "$raw" == *\\ ]]; then
    joined+="${raw%\\} "
    continue
  fi
  joined+=$raw
  joined=$(printf '%s' "$joined" | tr -s ' \t' ' ' | sed 's/^ //; s/ $//')
  [ -n "$joined" ] && run_instruction "$joined"
  joined=""
done <"$DOCKERFILE"

# ---- the image ----
R=$LAST_STAGE
ROOT=${STAGE_ROOT[$R]}
say "image (stage $R): user ${STAGE_USER[$R]}, workdir ${STAGE_DIR[$R]}, volume $VOLUMES, expose $EXPOSED"
say "image: ENTRYPOINT $ENTRYPOINT, CMD $CMD"
say "image: HEALTHCHECK $HEALTHCHECK_CMD"
bin=$(in_stage "$R" "command -v ${ENTRYPOINT%% *}") || die "${ENTRYPOINT%% *} is not on the image's PATH"
say "binary $bin: $(stat -c %s "$ROOT$bin") bytes ($(du -h "$ROOT$bin" | cut -f1)); $(file -b "$ROOT$bin" 2>/dev/null | cut -d, -f1-2,5- || true)"
say "libraries it needs, resolved inside the image:"
in_stage "$R" "ldd $bin" | sed 's/^/   /'
for v in $VOLUMES; do
  say "volume $v: $(stat -c '%U(%u):%G(%g) %a' "$ROOT$v")"
done

# Start the broker as the image would: ENTRYPOINT + CMD as the image's user in its WORKDIR,
# with the image's environment, in a network namespace of its own (loopback only), and run
# the HEALTHCHECK command in the same namespace.
LOG="$WORK/broker.log"
say "starting '$ENTRYPOINT $CMD' in the runtime chroot (own network namespace, loopback only)"
# shellcheck disable=SC2086
unshare --net --fork --kill-child /bin/sh -c '
  ip link set lo up
  exec chroot --userspec="$1" "$2" /usr/bin/env -i $3 /bin/sh -c "cd \"$4\" && exec $5"
' sh "${STAGE_USER[$R]}" "$ROOT" "${STAGE_ENV[$R]}" "${STAGE_DIR[$R]}" "$ENTRYPOINT $CMD" >"$LOG" 2>&1 &
BROKER_PID=$!
# The namespace belongs to the chroot's process, a child of unshare: find it to enter it.
ns_pid=""
for _ in $(seq 1 100); do
  ns_pid=$(pgrep -P "$BROKER_PID" | head -n1 || true)
  [ -n "$ns_pid" ] && grep -q '^listening on ' "$LOG" && break
  kill -0 "$BROKER_PID" 2>/dev/null || { cat "$LOG" >&2; die "the broker exited"; }
  sleep 0.2
done
grep -q '^listening on ' "$LOG" || { cat "$LOG" >&2; die "the broker did not say where it listens within 20 s"; }
say "broker says: $(grep '^listening on ' "$LOG")"
say "broker runs as uid $(stat -c %u "/proc/$ns_pid") (pid $ns_pid)"

healthcheck() {
  # shellcheck disable=SC2086
  nsenter --target "$ns_pid" --net chroot --userspec="${STAGE_USER[$R]}" "$ROOT" \
    /usr/bin/env -i ${STAGE_ENV[$R]} /bin/sh -c "cd '${STAGE_DIR[$R]}' && exec $HEALTHCHECK_CMD"
}
if healthcheck; then
  say "HEALTHCHECK ($HEALTHCHECK_CMD): exit 0, healthy"
else
  cat "$LOG" >&2
  die "HEALTHCHECK failed while the broker runs"
fi
for v in $VOLUMES; do
  say "volume $v now holds: $(cd "$ROOT$v" && stat -c '%n %U(%u) %s bytes' -- * | paste -sd ';' -)"
done

say "stopping the broker (SIGTERM)"
kill -TERM "$ns_pid"
wait "$BROKER_PID" && rc=0 || rc=$?
BROKER_PID=""
say "broker exited with status $rc; its log:"
sed 's/opadm_[A-Za-z0-9_-]*/opadm_<redacted>/; s/^/   /' "$LOG"
[ "$rc" = 0 ] || die "the broker did not stop cleanly"

# With the broker gone the health check must fail, or it proves nothing. Its namespace is
# gone with it, so this runs in a fresh loopback-only namespace.
# shellcheck disable=SC2016 # expanded by the inner shell
if unshare --net /bin/sh -c '
  ip link set lo up
  exec chroot --userspec="$1" "$2" /usr/bin/env -i $3 /bin/sh -c "exec $4"
' sh "${STAGE_USER[$R]}" "$ROOT" "${STAGE_ENV[$R]}" "$HEALTHCHECK_CMD" 2>"$WORK/probe.err"; then
  die "HEALTHCHECK passed with no broker running"
else
  say "HEALTHCHECK with no broker: exit $?, unhealthy ($(cat "$WORK/probe.err"))"
fi
say "OK: the Dockerfile's steps build the image, and it serves and passes its health check"
