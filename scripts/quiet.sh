# Sourced by the set-up scripts: run_logged CMD... runs CMD with its output appended to
# $DSPARK_SETUP_LOG (default <cache>/logs/setup.log) and prints that output's tail only
# when CMD fails, so a working set-up shows no build-backend or resolver chatter.
run_logged() {
  local log="${DSPARK_SETUP_LOG:-${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-sglang}/logs/setup.log}"
  mkdir -p "$(dirname "$log")"
  echo "### $(date -u +%FT%TZ) $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "[setup] failed: $*  (last lines of $log:)" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}
