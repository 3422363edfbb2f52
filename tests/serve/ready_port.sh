# Sourced by the serve test scripts. ready_port LOG PID [TENTHS]: the port a
# `loom serve --port 0` writing LOG announces once ready ("serve: ready: ...
# at http://127.0.0.1:PORT/v1"), waiting up to TENTHS tenths of a second
# (default 600); empty if the server exited or did not get ready in time.
ready_port() {
  local log=$1 pid=$2 tenths=${3:-600} port=""
  for _ in $(seq "$tenths"); do
    port=$(sed -n 's/.*serve: ready: .* at http:\/\/127\.0\.0\.1:\([0-9]*\)\/v1.*/\1/p' "$log")
    [[ -n $port ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "$port"
}
