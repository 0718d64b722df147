#!/usr/bin/env bash
# The README's CTR command, `deploy/local/run.sh deploy/local/ctr.yaml`, run as a user
# types it: it writes the generated data on first use, trains the CTR model and ends with
# its final line; kill -9 a server mid-run and the job carries on to the same result
# (replication 2, sync: the same weights, so the same AUC to the last digit).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"  # the README's commands run from the repository root

cache="$HOME/.cache/paramserver/ctr-demo"
had_data=0
[[ -s $cache/train.tsv.gz ]] && had_data=1

echo "an undisturbed run of deploy/local/ctr.yaml"
launch "$WORK/plain" deploy/local/ctr.yaml
wait_launcher 900
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
final_line='^final test_auc=0\.[0-9]{4} test_logloss=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=780$'
check "its last line is the CTR job's final line" grep -Eq "$final_line" <(last_line "$WORK/plain.out")
check "the data is in the cache" test -s "$cache/train.tsv.gz" -a -s "$cache/test.tsv.gz"
if ((had_data == 0)); then
  check "it said it wrote the data, once" grep -q "run.sh: writing the generated CTR data into $cache (once)" "$WORK/plain.out"
fi
check "rank 0 logged the test AUC after the first epoch" grep -Eq "epoch 0 test_auc=0\.[0-9]{4} test_logloss=" "$WORK/plain"/worker-*.log
auc=$(last_line "$WORK/plain.out" | grep -Eo "test_auc=[0-9.]+")

echo "kill -9 a server mid-run: its backups take over, the result is the same"
launch "$WORK/server" deploy/local/ctr.yaml
wait_for_line "$WORK/server/worker-0.log" "epoch 0 step [0-9]+/780" 300
kill9 "$WORK/server" server-1
wait_launcher 900
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the CTR job's final line" grep -Eq "$final_line" <(last_line "$WORK/server.out")
check "the scheduler promoted backups" grep -q " promoted" "$WORK/server/scheduler.log"
check "the same test AUC as the undisturbed run ($auc)" grep -q "$auc " <(last_line "$WORK/server.out")
check "the data was not written again" bash -c "! grep -q 'writing the generated CTR data' '$WORK/server.out'"

finish
