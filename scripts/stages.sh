# Sourced by quickstart.sh and test.sh: `stage NAME COMMAND...` runs a stage
# and records how long it took; `stage_summary` prints the times, so a
# newcomer sees where a first run spends its minutes.
stage_times=()
stage() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  stage_times+=("$name $((SECONDS - start)) s")
}
stage_summary() {
  local joined
  joined=$(printf '%s, ' "${stage_times[@]}")
  echo "$(basename "$0"): stage times: ${joined%, }"
}
