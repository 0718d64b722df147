#!/usr/bin/env bash
# The second Python example, `deploy/local/run.sh examples/pytorch_ctr/job.yaml`, run as
# a user types it: a PyTorch CTR model whose categorical features index a
# paramserver.Embedding table on the servers trains on the generated Criteo-format data
# (written on first use) and learns: its test AUC is well above chance (0.5).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"  # the README's commands run from the repository root

echo "deploy/local/run.sh examples/pytorch_ctr/job.yaml"
launch "$WORK/ctr" examples/pytorch_ctr/job.yaml
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" \
  grep -Eq '^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=[0-9]+$' <(last_line "$WORK/ctr.out")
auc=$(cat "$WORK"/ctr/worker-*.log | grep -Eo "test auc [0-9.]+" | cut -d" " -f3)  # rank 0: whichever registered first
check "rank 0's test AUC ($auc) is well above chance (0.5): the table's rows learned" \
  awk -v a="${auc:-0}" 'BEGIN { exit !(a >= 0.65) }'

finish
