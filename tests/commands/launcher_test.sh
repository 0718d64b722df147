#!/usr/bin/env bash
# The README's main command, `deploy/local/run.sh CONFIG`, run as a user types it, with
# the product's promise tested through it: kill -9 a server, a worker, the scheduler,
# and the job carries on. Sync training, shuffle off: a run that loses only replicated
# servers or a restarted scheduler ends with weights bit-identical to an undisturbed
# run's.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

config=$WORK/job.yaml
# The reference job for 4 epochs, replication 2; workers ride a scheduler outage out for
# 20 s, servers for 40 s.
write_config "$config" replication 2 epochs 4 weights "$WORK/weights.safetensors" recovery 20000
# Twice as long, where killed daemons must be restarted before the job ends: a restart
# waits for the failure timeout and 2 s more.
write_config "$WORK/long.yaml" replication 2 epochs 8 weights "$WORK/weights.safetensors" recovery 20000

training_started() { wait_for_line "$1/worker-0.log" "training steps" 300; }

echo "an undisturbed run"
launch "$WORK/plain" "$config"
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=3748$" \
  <(last_line "$WORK/plain.out")
check "it names the final report, which the scheduler wrote into the run's folder" \
  grep -q "run.sh: final report: $WORK/plain/report.html (open it in a browser)" "$WORK/plain.out"
check "the report holds the final status" grep -q '"verdict":"finished"' "$WORK/plain/report.html"
mv "$WORK/weights.safetensors" "$WORK/plain.safetensors"

echo "kill -9 a server mid-run (replication 2): its backups take over"
launch "$WORK/server" "$config"
training_started "$WORK/server"
sleep 2
kill9 "$WORK/server" server-1
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=" <(last_line "$WORK/server.out")
check "the launcher said what died and that the cluster carries on" \
  grep -q "run.sh: server-1 (pid [0-9]*) died (killed by SIGKILL); the cluster carries on without it" "$WORK/server.out"
check "the scheduler replaced it" grep -q "$(node_name "$WORK/server" server-1) lost" "$WORK/server/scheduler.log"
check "the weights equal the undisturbed run's" cmp "$WORK/weights.safetensors" "$WORK/plain.safetensors"
rm -f "$WORK/weights.safetensors"

echo "kill -9 a server, then the rank-0 worker, no restart: the job finishes without them"
launch "$WORK/without" "$config"
training_started "$WORK/without"
sleep 2
kill9 "$WORK/without" server-1
sleep 3
rank0=$(daemon_named "$WORK/without" worker-0)
kill9 "$WORK/without" "$rank0"
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=" <(last_line "$WORK/without.out")
check "the scheduler lost rank 0 and went on" \
  grep -q "worker-0 lost; sync steps complete without it" "$WORK/without/scheduler.log"
check "the killed worker had not finished" bash -c "! grep -q 'finished [0-9]* steps' '$WORK/without/$rank0.log'"
check "the other worker evaluated in its place" grep -q "rank 0 is gone and no worker took its place" \
  "$WORK"/without/worker-*.log
rm -f "$WORK/weights.safetensors"

echo "kill -9 a server, then a worker, with --restart: both come back (and the status page, metrics and psctl work)"
launch "$WORK/both" --restart --status-port 0 --metrics "$WORK/long.yaml"
training_started "$WORK/both"
status_url=$(grep -o "status page: http://127.0.0.1:[0-9]*/" "$WORK/both.out" | head -n 1 | sed 's/status page: //')
check "the launcher printed the status page's address" test -n "$status_url"
check "the status page serves the cluster's status" bash -c "curl -sf '${status_url}api/status' | grep -q '\"nodes\"'"
check "and the scheduler's metrics" bash -c "curl -sf '${status_url}metrics' | grep -q '^scheduler_map_version'"
server_port=$(grep -o 'metrics on http://127.0.0.1:[0-9]*' "$WORK/both/server-0.log" | head -n 1 | sed 's/.*://')
check "a server serves its metrics" bash -c "curl -sf 'http://127.0.0.1:$server_port/metrics' | grep -q '^ps_serving_map_version'"
psctl_command=$(grep -o "PSCTL_CLUSTER_TOKEN_FILE=[^ ]* [^ ]*/psctl --scheduler [^ ]* status" "$WORK/both.out" | head -n 1)
check "the psctl command it printed works" bash -c "env $psctl_command | grep -q 'worker-0'"
sleep 2
kill9 "$WORK/both" server-1
sleep 3
worker_pid=$(cat "$WORK/both/worker-1.pid")
kill9 "$WORK/both" worker-1
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=" <(last_line "$WORK/both.out")
first_life_finished=$(awk '/registered with the scheduler/ {n++} n == 1' "$WORK/both/worker-1.log" | grep -c "finished [0-9]* steps")
check "the killed worker had not finished its steps" test "$first_life_finished" -eq 0
check "the server was restarted" grep -q "run.sh: server-1 (pid [0-9]*) died (killed by SIGKILL); restarting it" "$WORK/both.out"
check "the worker was restarted" grep -q "run.sh: worker-1 (pid $worker_pid) died (killed by SIGKILL); restarting it" "$WORK/both.out"
check "the restarted server rejoined" test "$(grep -c "registered with the scheduler" "$WORK/both/server-1.log")" -ge 2
check "the restarted worker rejoined" test "$(grep -c "registered with the scheduler" "$WORK/both/worker-1.log")" -ge 2
check "the weights were written" test -s "$WORK/weights.safetensors"
rm -f "$WORK/weights.safetensors"

echo "kill -9 the scheduler mid-run (no flags): it comes back and takes the job over from its state file"
launch "$WORK/scheduler" "$config"
training_started "$WORK/scheduler"
sleep 2
kill9 "$WORK/scheduler" scheduler
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=" <(last_line "$WORK/scheduler.out")
check "the scheduler was restarted" grep -q "run.sh: scheduler (pid [0-9]*) died (killed by SIGKILL); restarting it" \
  "$WORK/scheduler.out"
check "it took the job over" grep -q "took over the running job from" "$WORK/scheduler/scheduler.log"
check "the weights equal the undisturbed run's" cmp "$WORK/weights.safetensors" "$WORK/plain.safetensors"
rm -f "$WORK/weights.safetensors"

echo "kill -9 the scheduler until it is not restarted (5 starts in a minute): it stays down; the daemons give up at their deadlines, rank 0 finishes without it"
launch "$WORK/lost" "$config"
# Killed once rank 0 has evaluated epoch 2 (of 0..3): the last epoch must end within the
# workers' 20 s limit, on a slow machine too (killed 2 s into training, a CI machine at
# half this one's speed once ran out of time).
# (Either worker's log: which launcher slot the scheduler made rank 0 varies.)
deadline=$((SECONDS + 300))
until grep -qs "epoch 2 test_accuracy=" "$WORK"/lost/worker-*.log || ((SECONDS >= deadline)); do
  sleep 0.1
done
# Each kill once the launcher has restarted it (a new pid in its pid file), until it
# says it will not: its 5th start in a minute (the first start counts while it is less
# than a minute old, so on a slow machine that takes one kill more).
for kill in 1 2 3 4 5 6; do
  pid=$(cat "$WORK/lost/scheduler.pid")
  kill9 "$WORK/lost" scheduler
  until [[ $(cat "$WORK/lost/scheduler.pid") != "$pid" ]] || grep -q "scheduler .*not restarting it" "$WORK/lost.out" ||
    ((SECONDS >= deadline)); do sleep 0.1; done
  grep -q "scheduler .*not restarting it" "$WORK/lost.out" && break
done
killed_at=$SECONDS
wait_launcher 600
check "the launcher stopped restarting it" grep -q "scheduler (pid [0-9]*) died (killed by SIGKILL), its 5th time in a minute: not restarting it" \
  "$WORK/lost.out"
check "it says the job finished without the scheduler, and exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is rank 0's: training finished and the weights were written" grep -Eq \
  "^training finished \(3748 steps, final test_accuracy=0\.[0-9]+\) and the final weights were written to $WORK/weights.safetensors$" \
  <(last_line "$WORK/lost.out")
check "every daemon was gone within the servers' 40 s deadline (+ 10 s to notice and stop)" \
  test $((SECONDS - killed_at)) -le 50
check "the workers gave up at 20 s" test "$(grep -l "has not answered for 2[0-9] s (this node's limit: 20 s" "$WORK"/lost/worker-*.log | wc -l)" -eq 2
check "the servers gave up at 40 s" test "$(grep -l "has not answered for 4[0-9] s (this node's limit: 40 s" "$WORK"/lost/server-*.log | wc -l)" -eq 2
check "they equal the undisturbed run's" cmp "$WORK/weights.safetensors" "$WORK/plain.safetensors"

echo "kill -9 a server of a job without backups or checkpoints: the launcher says why the job cannot go on"
write_config "$WORK/fragile.yaml" replication 1
launch "$WORK/fragile" "$WORK/fragile.yaml"
training_started "$WORK/fragile"
kill9 "$WORK/fragile" server-1
wait_launcher 300
check "it exits 1" test "$LAUNCHER_STATUS" -eq 1
check "saying the scheduler ended the job, and why" grep -Eq \
  "run.sh: the job did not finish: the scheduler ended it \(lost ps-[01]: shards \[[0-9, ]+\] of ps-[01] had no other copy and cannot be restored: checkpoint.dir is not set \(cluster.replication >= 2 or checkpoint.dir would have kept them\); the job cannot go on\)$" \
  "$WORK/fragile.out"
check "the scheduler told every node to stop before it exited" \
  grep -q "job ended unfinished; every node has been told to stop" "$WORK/fragile/scheduler.log"

echo "a bad config stops the launcher at once, with exit 2"
printf 'cluster:\n  servers: 0\n' >"$WORK/bad.yaml"
launch "$WORK/bad" "$WORK/bad.yaml"
wait_launcher 300
check "it exits 2" test "$LAUNCHER_STATUS" -eq 2
check "naming the file and the problem" grep -q "bad.yaml:2: cluster.scheduler: must be host:port" "$WORK/bad.out"

echo "a data file that is not there stops the launcher before any daemon starts, naming the key"
sed "s|train_labels: .*|train_labels: $WORK/no-such-labels.gz|" "$config" >"$WORK/nodata.yaml"
launch "$WORK/nodata" "$WORK/nodata.yaml"
wait_launcher 300
check "it exits 2" test "$LAUNCHER_STATUS" -eq 2
check "naming the key, the path and why" grep -q "ps_scheduler: data.train_labels: $WORK/no-such-labels.gz cannot be read: No such file or directory" "$WORK/nodata.out"
check "no daemon was started" test ! -e "$WORK/nodata/scheduler.log"

echo "Ctrl-C: the launcher says the user stopped the job"
launch "$WORK/interrupted" "$config"
training_started "$WORK/interrupted"
kill -INT "$LAUNCHER_PID"
wait_launcher 60
check "it exits 130" test "$LAUNCHER_STATUS" -eq 130
check "saying the user stopped it" grep -q "run.sh: stopped by the user (Ctrl-C); stopping the cluster" "$WORK/interrupted.out"
check "not blaming a daemon" bash -c "! grep -q 'failed (' '$WORK/interrupted.out'"
check "no daemon is left" bash -c "for f in '$WORK'/interrupted/*.pid; do ! kill -0 \$(cat \$f) 2>/dev/null || exit 1; done"

finish
