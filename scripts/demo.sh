#!/usr/bin/env bash
# `make demo`: start a local Ray head (token auth on, dashboard on localhost only), submit the demo job to
# it with `ray job submit --working-dir .`, stream its logs, print the dashboard URL and the result, and
# stop only the head this script started (other Ray clusters on the machine are left alone).
#
#   PRESET=smoke make demo          a one-minute run instead of the demo preset
#   DASHBOARD_PORT=8266 make demo   if 8265 is taken
#   EXTRA="--epochs 3" make demo    more flags for jobs/ucf101.py
#   NUM_CPUS=8 make demo            the head's logical CPUs (default: the cores, at least 3)
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="$PWD/.venv/bin:$PATH"
export RAY_AUTH_MODE=token
PRESET=${PRESET:-demo}
GCS_PORT=${GCS_PORT:-6390}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
# Logical CPUs of the head: the machine's cores, and at least 3 (the 2 learners hold one each, the data
# tasks need one more). Declaring more than the cores starts more data tasks, each in a Python worker of
# its own, on cores the learners already use: on the 2-core box 4 instead of 3 made every demo slower
# (the timings are in docs/LOG.md, 2026-11-24).
CORES=$(nproc)
NUM_CPUS=${NUM_CPUS:-$(( CORES > 3 ? CORES : 3 ))}
STORAGE=${STORAGE:-$HOME/raytrain_seq_runs}
RUN_NAME=${RUN_NAME:-demo-$(date -u +%Y%m%d-%H%M%S)}
# A temp dir of our own: every process of this head carries it on its command line, which is how the
# cleanup below finds them (plain `ray stop` would also stop any other cluster on the machine).
RAY_TMP=$(mktemp -d /tmp/rts.XXXXXX)

stop_head() {
  echo "stopping the Ray head started by make demo"
  # The head's processes carry $RAY_TMP on their command line; their children (the dashboard and
  # runtime-env agents, the workers) rename themselves "ray::..." and, orphaned, ran on using CPU for
  # minutes after a demo (docs/LOG.md): so the whole tree goes. The Ray client server is no one's child
  # (its parent, `ray start`, has exited): it is found by its port.
  local pids all="" alive
  pids=$(pgrep -f -- "$RAY_TMP|ray.util.client.server .*--port=$CLIENT_PORT( |$)" || true)
  while [[ -n $pids ]]; do
    all="$all $pids"
    pids=$(for pid in $pids; do pgrep -P "$pid" || true; done)
  done
  [[ -n $all ]] && kill -TERM $all 2>/dev/null || true
  for _ in $(seq 20); do
    alive=$(for pid in $all; do if kill -0 "$pid" 2>/dev/null; then echo "$pid"; fi; done)
    [[ -z $alive ]] && break
    sleep 0.5
  done
  [[ -n ${alive:-} ]] && kill -KILL $alive 2>/dev/null || true
  rm -rf "$RAY_TMP"
}

# The token lives in ~/.ray/auth_token; the head and `ray job submit` both read it.
ray get-auth-token --generate >/dev/null 2>&1
# Keep idle task workers a minute (Ray's default is a second), so each epoch's data tasks reuse the
# last epoch's Python workers instead of starting new ones (raytrain_seq/runtime/connect.py: WORKER_REUSE),
# and fail a call to a dead actor at once (DEATH_AT_ONCE there: the learners need no runtime env then).
# Ports the head would otherwise take at fixed defaults (the dashboard agent's 52365, the Ray client's
# 10001): another Ray cluster on this machine may hold them, and then the job agent never comes up and
# every submission is refused. Free ones are picked here (the OS hands out unused ports for port 0).
read -r AGENT_PORT CLIENT_PORT < <(python -c 'import socket
ports = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); ports.append(s); print(s.getsockname()[1], end=" ")
for s in ports: s.close()
print()')
RAY_idle_worker_killing_time_threshold_ms=60000 RAY_timeout_ms_task_wait_for_death_info=0 ray start --head --port "$GCS_PORT" --dashboard-host 127.0.0.1 --dashboard-port "$DASHBOARD_PORT" \
  --dashboard-agent-listen-port "$AGENT_PORT" --ray-client-server-port "$CLIENT_PORT" \
  --num-cpus "$NUM_CPUS" --temp-dir "$RAY_TMP" --disable-usage-stats >/dev/null
trap stop_head EXIT
echo "Ray dashboard: http://127.0.0.1:$DASHBOARD_PORT (token auth: the token is in ~/.ray/auth_token)"

ADDRESS="http://127.0.0.1:$DASHBOARD_PORT"

# The head's job agent comes up a few seconds after `ray start` returns: until then a submission is
# refused with "No available agent"; nothing was started, so trying again is safe.
for attempt in $(seq 60); do
  if out=$(ray job submit --address "$ADDRESS" --no-wait --submission-id "$RUN_NAME" --working-dir . -- \
      python jobs/ucf101.py --preset "$PRESET" --storage-path "$STORAGE" --run-name "$RUN_NAME" ${EXTRA:-} 2>&1); then
    break
  fi
  if ! grep -q "No available agent" <<<"$out" || [[ $attempt == 60 ]]; then
    echo "$out" >&2
    exit 1
  fi
  sleep 2
done
echo "submitted job $RUN_NAME; streaming its logs (Ctrl-C stops following, not the job)"
ray job logs --address "$ADDRESS" --follow "$RUN_NAME"
status=$(python -c 'import sys; from ray.job_submission import JobSubmissionClient as C
print(C(sys.argv[1]).get_job_status(sys.argv[2]))' "$ADDRESS" "$RUN_NAME" 2>&1 | tail -n 1)
echo "job $RUN_NAME: $status"
echo "Ray dashboard: http://127.0.0.1:$DASHBOARD_PORT"
if [[ $status != *SUCCEEDED* ]]; then
  echo "the job did not succeed: see the logs above" >&2
  exit 1
fi
echo "result: $STORAGE/$RUN_NAME/summary.json and $STORAGE/$RUN_NAME/curves.png"
