# Sourced by run.sh and test.sh: installs the Debian packages given as
# arguments that are not installed yet (as root, or through sudo).
install_missing() {
  local missing=() p sudo=""
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "installing: ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# make_venv NAME LOCK: builds .venv/NAME from a pinned, hashed lock file with
# Debian's python3 and its site packages visible (Debian's CPU torch serves
# both stacks). It is rebuilt only when the lock file changes.
make_venv() {
  local name=$1 lock=$2 dir=.venv/$1 stamp
  stamp=$(sha256sum "$lock" | cut -d' ' -f1)
  if [ -f "$dir/.lock-sha256" ] && [ "$(cat "$dir/.lock-sha256")" = "$stamp" ]; then
    return 0
  fi
  echo "building virtualenv $dir from $lock"
  rm -rf "$dir"
  /usr/bin/python3 -m venv --system-site-packages "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$lock"
  echo "$stamp" >"$dir/.lock-sha256"
}

# with_progress LOG LABEL CMD...: runs CMD with its output in LOG, and says
# every 10 s that LABEL is still running (a first build takes a minute or
# two, silence looks like a hang). Returns CMD's status.
with_progress() {
  local log=$1 label=$2 start=$SECONDS pid rc=0
  shift 2
  echo "$label (log: $log)"
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( (SECONDS - start) % 10 == 0 )) && kill -0 "$pid" 2>/dev/null; then
      echo "  ... still $label: $((SECONDS - start)) s"
    fi
  done
  wait "$pid" || rc=$?
  echo "  done in $((SECONDS - start)) s"
  return "$rc"
}

# tools_venv CACHE LOCK: prints the path of a virtualenv of the pinned,
# hashed LOCK (no system site packages), made once under CACHE and keyed by
# the lock's hash, so that repeated builds reuse it.
tools_venv() {
  local cache=$1 lock=$2 dir stamp
  stamp=$(sha256sum "$lock" | cut -c1-16)
  dir=$cache/$(basename "$lock" .txt)-$stamp
  if [ ! -f "$dir/.complete" ]; then
    echo "building the tools virtualenv $dir from $lock" >&2
    rm -rf "$dir"
    mkdir -p "$cache"
    /usr/bin/python3 -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$lock" >&2
    touch "$dir/.complete"
  fi
  echo "$dir"
}
