#!/usr/bin/env bash
# The README's Python example, `deploy/local/run.sh examples/pytorch_cnn/job.yaml`, run as
# a user types it: two workers run the example's PyTorch script through the paramserver
# package on 2 servers (replication 2), with SGD + momentum + weight decay and a StepLR
# schedule through paramserver.DistributedOptimizer. psctl shows the script workers'
# step, loss and samples/s; a server is killed with kill -9 mid-run and the job still
# ends with its final line and a test accuracy of at least 0.90. Then the README's
# one-process command trains the same recipe without servers, and the job's accuracy is
# at least that one's.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"  # the README's commands run from the repository root

echo "deploy/local/run.sh examples/pytorch_cnn/job.yaml, with kill -9 of a server mid-run"
launch "$WORK/cnn" examples/pytorch_cnn/job.yaml
wait_for_line "$WORK/cnn.out" "PSCTL_CLUSTER_TOKEN_FILE=" 300
check "the workers declared the model" wait_for_line "$WORK/cnn/worker-1.log" "declared the model" 300
sleep 8  # a few seconds of training: every worker has reported progress
psctl_command=$(grep -o "PSCTL_CLUSTER_TOKEN_FILE=[^ ]* [^ ]*/psctl --scheduler [^ ]* status" "$WORK/cnn.out" | head -n 1)
env $psctl_command >"$WORK/psctl.txt" 2>&1
check "psctl status shows both script workers" grep -Eq "worker-1" "$WORK/psctl.txt"
# NODE ROLE ADDRESS HEALTH LAST-HEARTBEAT(3 words) STEP EPOCH LOSS SAMPLES/S
check "psctl status shows each script worker's step, loss and samples/s" \
  awk '$1 ~ /^worker-[01]$/ && $4 == "alive" && $8 > 0 && $10 > 0 && $11 > 0 { n++ } END { exit !(n == 2) }' "$WORK/psctl.txt"
kill9 "$WORK/cnn" server-1
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
final=$(last_line "$WORK/cnn.out")
check "its last line is the job's final line" grep -Eq '^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=[0-9]+$' <<<"$final"
accuracy=$(grep -Eo "test_accuracy=[0-9.]+" <<<"$final" | cut -d= -f2)
check "the test accuracy ($accuracy) is at least 0.90" awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.90) }'
check "the scheduler promoted the killed server's backups" grep -q " promoted" "$WORK/cnn/scheduler.log"
# Rank 0 is whichever launched worker registered first.
check "rank 0's script printed its test accuracy" grep -q "test accuracy $accuracy" "$WORK"/cnn/worker-*.log

echo "/usr/bin/python3 examples/pytorch_cnn/train.py --one-process examples/pytorch_cnn/job.yaml"
/usr/bin/python3 examples/pytorch_cnn/train.py --one-process examples/pytorch_cnn/job.yaml \
  >"$WORK/one_process.out" 2>&1
check "the one-process run exits 0" test $? -eq 0
alone=$(grep -Eo "^one process: test accuracy [0-9.]+" "$WORK/one_process.out" | awk '{ print $5 }')
echo "the job: $accuracy; one process, the same recipe: $alone"
# Each of the job's sync steps is one step of the one-process run (the mean loss over
# the same 64 examples, the same rate), so the two differ only in float32 rounding (the
# mean of two workers' mean gradients against one mean over 64, the servers' update
# against torch's: within 3e-8 a step, recipe_test), which 1874 steps of SGD amplify
# into another point near the same minimum. Its test accuracy is an estimate from
# 10000 images, with a standard error of sqrt(0.9 x 0.1 / 10000) = 0.003; "at least"
# allows two of those (measured here: 0.9035 against 0.9064, with BatchNorm, whose running
# statistics the job averages over the workers where one process updates them in turn).
check "the job's accuracy ($accuracy) is at least one process's ($alone), within 0.006" \
  awk -v a="$accuracy" -v b="$alone" 'BEGIN { exit !(b != "" && a >= b - 0.006) }'

finish
