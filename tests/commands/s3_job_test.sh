#!/usr/bin/env bash
# A job whose data, checkpoints, weights and report are s3:// URIs, run with the README's
# command (`deploy/local/run.sh CONFIG`) against the recording stand-in `aws`
# (tests/stand_ins/aws: objects kept as files, the real CLI's answers and errors). The
# same job with local paths must end with byte-identical weights.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export AWS_STANDIN_ROOT=$WORK/aws
export PATH="$ROOT/tests/stand_ins:$PATH"
export PS_CACHE_DIR=$WORK/cache
mkdir -p "$AWS_STANDIN_ROOT/s3/ps-data/fashion" "$AWS_STANDIN_ROOT/s3/ps-out"
for file in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  cp "$file" "$AWS_STANDIN_ROOT/s3/ps-data/fashion/"
done

# 600 steps, a checkpoint every 200, shuffle off (deterministic in sync mode).
write_config "$WORK/local.yaml" weights "$WORK/local.safetensors"
sed -i -e 's/^  max_steps: .*/  max_steps: 600/' "$WORK/local.yaml"
sed -e 's|/usr/share/datasets/fashion-mnist/|s3://ps-data/fashion/|' \
  -e 's|^  weights: .*|  weights: s3://ps-out/run1/weights.safetensors\n  report: s3://ps-out/run1/report.html|' \
  "$WORK/local.yaml" >"$WORK/s3.yaml"
printf 'checkpoint:\n  dir: s3://ps-out/run1/checkpoints\n  every_steps: 200\n' >>"$WORK/s3.yaml"

echo "the job with local files"
launch "$WORK/local" "$WORK/local.yaml"
wait_launcher 300
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0

echo "the same job from and to S3"
launch "$WORK/s3" "$WORK/s3.yaml"
wait_launcher 300
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=600$" \
  <(last_line "$WORK/s3.out")
weights=$AWS_STANDIN_ROOT/s3/ps-out/run1/weights.safetensors
check "the weights arrived in the bucket" test -s "$weights"
check "they equal the local run's, byte for byte" cmp "$weights" "$WORK/local.safetensors"
check "the final report arrived too" grep -q '"verdict":"finished"' "$AWS_STANDIN_ROOT/s3/ps-out/run1/report.html"
check "every shard's checkpoints are in the bucket" bash -c \
  "ls '$AWS_STANDIN_ROOT/s3/ps-out/run1/checkpoints' | grep -c '^shard-[0-9]*-step-600\.ckpt$' | grep -qx 8"
calls=$AWS_STANDIN_ROOT/calls.log
check "each worker downloaded the data with the CLI" bash -c \
  "grep -Ec '^s3 cp s3://ps-data/fashion/train-images-idx3-ubyte.gz $WORK/cache/ps-data/fashion/train-images-idx3-ubyte.gz.part.[0-9]+ ' '$calls' | grep -qx 2"
check "the weights were uploaded whole and then renamed into place" grep -Eq \
  "^s3 mv s3://ps-out/run1/weights.safetensors.tmp[.0-9]+ s3://ps-out/run1/weights.safetensors" "$calls"
check "no probe object is left" bash -c "! find '$AWS_STANDIN_ROOT/s3' -name '.ps-write-check*' | grep -q ."

echo "kill -9 a server (no replica): the job rolls back to the newest checkpoint, read from S3"
sed -e 's|^  max_steps: .*|  max_steps: 6000|' -e 's|^  epochs: .*|  epochs: 7|' \
  -e 's/^  failure_timeout_ms: .*/&\n  replication: 1/' \
  -e 's|s3://ps-out/run1/|s3://ps-out/run2/|' "$WORK/s3.yaml" >"$WORK/restore.yaml"
launch "$WORK/restore" "$WORK/restore.yaml" --restart
# Once every shard has a checkpoint in the bucket (step 400 is written after step 200).
for _ in $(seq 600); do
  (($(ls "$AWS_STANDIN_ROOT/s3/ps-out/run2/checkpoints" 2>/dev/null | grep -c 'step-400\.ckpt$') >= 8)) && break
  sleep 0.1
done
kill9 "$WORK/restore" server-1
wait_launcher 300
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=6000$" \
  <(last_line "$WORK/restore.out")
check "every shard rolled back to its checkpoint" grep -Eq "lost; .*every shard rolls back to its checkpoint at step [1-9][0-9]*" \
  "$WORK/restore/scheduler.log"
check "the restored shards were read from the bucket" grep -Eq \
  "^s3 cp s3://ps-out/run2/checkpoints/shard-[0-9]+-step-[1-9][0-9]*\.ckpt -" "$calls"
check "the weights arrived" test -s "$AWS_STANDIN_ROOT/s3/ps-out/run2/weights.safetensors"

echo "an output bucket that does not exist stops the launcher before any daemon starts"
sed 's|s3://ps-out/|s3://no-such-bucket/|' "$WORK/s3.yaml" >"$WORK/nobucket.yaml"
launch "$WORK/nobucket" "$WORK/nobucket.yaml"
wait_launcher 120
check "it exits 2" test "$LAUNCHER_STATUS" -eq 2
check "naming the key and what S3 said" grep -q \
  "ps_scheduler: checkpoint.dir: s3://no-such-bucket/run1/checkpoints cannot be written (checked at start, so that nothing is lost at the end): .*NoSuchBucket" \
  "$WORK/nobucket.out"
finish
