#!/usr/bin/env bash
# A full checkpoint disk, for real: the job's checkpoint.dir is a 16 MiB tmpfs (in a user
# and mount namespace this test makes), filled before the job starts. The failure shows
# in `psctl status` and in the metrics; once space is freed, checkpoints are written
# again; training is never harmed (the weights equal those of a run without
# checkpoints). Skipped where unprivileged namespaces are not allowed.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! unshare --user --map-root-user --mount true 2>/dev/null; then
  echo "SKIPPED: this machine does not allow unprivileged user and mount namespaces (unshare -rm)"
  exit 0
fi

write_config "$WORK/plain.yaml" replication 2 epochs 6 weights "$WORK/plain.safetensors"
write_config "$WORK/job.yaml" replication 2 epochs 6 weights "$WORK/weights.safetensors"
sed -i "s|^  dir: .*|  dir: $WORK/disk|; s|^  every_steps: .*|  every_steps: 200|" "$WORK/job.yaml"
grep -q "^checkpoint:" "$WORK/job.yaml" || printf 'checkpoint:\n  dir: %s\n  every_steps: 200\n  keep: 2\n' "$WORK/disk" >>"$WORK/job.yaml"
mkdir -p "$WORK/disk"

echo "the job without checkpoints"
launch "$WORK/plain" "$WORK/plain.yaml"
wait_launcher 600
check "it finishes" test "$LAUNCHER_STATUS" -eq 0

# Inside the namespace: mount and fill the disk, start the job, watch it as an operator
# would, free the space, and let the job finish. What it saw goes to $WORK (not the tmpfs).
cat >"$WORK/inside.sh" <<INSIDE
set -u
# 16 MiB: room for the 2 kept checkpoints (1.2 MB a step for this model, weights and
# moments) several times over, once the filler is gone.
mount -t tmpfs -o size=16m tmpfs "$WORK/disk" || exit 3
dd if=/dev/zero of="$WORK/disk/filler" bs=64k count=256 status=none  # all 16 MiB: no room left
PS_RUN_DIR="$WORK/full" "$ROOT/deploy/local/run.sh" --status-port 0 --metrics "$WORK/job.yaml" >"$WORK/full.out" 2>&1 &
launcher=\$!
psctl() { env \$(grep -o "PSCTL_CLUSTER_TOKEN_FILE=[^ ]*" "$WORK/full.out" | head -n 1) \
  "$ROOT/bazel-bin/psctl/psctl" --scheduler \$(grep -o "^scheduler: [^ ]*" "$WORK/full.out" | head -n 1 | cut -d' ' -f2) status; }
for _ in \$(seq 600); do
  psctl >"$WORK/status-full.txt" 2>&1
  grep -q "checkpoints failing on ps-" "$WORK/status-full.txt" && break
  sleep 0.1
done
status_port=\$(grep -o "status page: http://127.0.0.1:[0-9]*/" "$WORK/full.out" | head -n 1 | sed -E 's|.*:([0-9]+)/|\1|')
curl -sf "http://127.0.0.1:\$status_port/metrics" >"$WORK/metrics-full.txt"
server_port=\$(grep -o 'metrics on http://127.0.0.1:[0-9]*' "$WORK/full/server-0.log" | head -n 1 | sed 's/.*://')
curl -sf "http://127.0.0.1:\$server_port/metrics" >"$WORK/server-metrics-full.txt"
rm -f "$WORK/disk/filler"  # the operator frees space
for _ in \$(seq 300); do  # until psctl no longer shows a failure (30 s at most)
  psctl >"$WORK/status-freed.txt" 2>&1
  grep -q "checkpoints failing" "$WORK/status-freed.txt" || break
  sleep 0.1
done
ls "$WORK/disk" >"$WORK/disk-listing.txt"
wait \$launcher
INSIDE
echo "the job with its checkpoint disk full, then freed"
set -m
unshare --user --map-root-user --mount bash "$WORK/inside.sh" &
inside=$!
set +m
STARTED_GROUPS+=("$inside")
wait "$inside"
inside_status=$?
check "the job finished (exit 0)" test "$inside_status" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=" <(last_line "$WORK/full.out")
check "the launcher warned at start that the checkpoint disk was full, and started the job anyway" \
  grep -q "ps_scheduler: warning: checkpoint.dir: .* has no space left now: .*No space left on device (the job starts anyway" "$WORK/full.out"
check "psctl status named the failing server, the step and the error" \
  grep -Eq "^checkpoints failing on ps-[01] since step 0 \([0-9]+ writes?\): .*No space left on device" "$WORK/status-full.txt"
check "the scheduler's metrics had it" grep -Eq '^scheduler_checkpoint_failed_writes\{node="ps-[01]"\} [1-9]' "$WORK/metrics-full.txt"
check "the server's metrics had it" grep -Eq '^ps_checkpoint_failed_writes [1-9]' "$WORK/server-metrics-full.txt"
check "the servers said when checkpoints were written again" grep -q "checkpoints are written again" "$WORK"/full/server-*.log
check "psctl status, still answering, no longer showed a failure" \
  bash -c "grep -q '^map version ' '$WORK/status-freed.txt' && ! grep -q 'checkpoints failing' '$WORK/status-freed.txt'"
check "checkpoint files were written after the space was freed" grep -q "^shard-.*-step-.*\.ckpt$" "$WORK/disk-listing.txt"
check "training was not harmed: the weights equal the run's without checkpoints" \
  cmp "$WORK/weights.safetensors" "$WORK/plain.safetensors"
finish
