#!/bin/bash
# The image's one entry point (/usr/local/bin/paramserver):
#   paramserver scheduler|server|worker|psctl|checkpoint-export [FLAGS...]
#   paramserver train   (SageMaker's contract: deploy/container/sagemaker_train.py)
# runs that binary of the release in /opt/paramserver with FLAGS (each binary's --help
# lists its own); `paramserver version` prints the release. The binaries' own names
# (ps_scheduler, ps_server, ps_worker, psctl, ps_checkpoint_export) work too.
set -euo pipefail
RELEASE=/opt/paramserver
usage() {
  cat <<'USAGE'
usage: paramserver COMMAND [FLAGS...]
  scheduler          the scheduler (ps_scheduler)
  server             a parameter server (ps_server)
  worker             a worker (ps_worker)
  psctl              the admin CLI
  checkpoint-export  a checkpoint's weights to a file (ps_checkpoint_export)
  train              SageMaker's training-container contract: this instance's part of
                     the job /opt/ml/input/config describes (paramserver train --help)
  version            the release this image holds
USAGE
}
command=${1:-}
(($#)) && shift
case "$command" in
  scheduler | ps_scheduler) exec "$RELEASE/bin/ps_scheduler" "$@" ;;
  server | ps_server) exec "$RELEASE/bin/ps_server" "$@" ;;
  worker | ps_worker) exec "$RELEASE/bin/ps_worker" "$@" ;;
  psctl) exec "$RELEASE/bin/psctl" "$@" ;;
  checkpoint-export | ps_checkpoint_export) exec "$RELEASE/bin/ps_checkpoint_export" "$@" ;;
  train) exec /usr/bin/python3 /usr/local/lib/paramserver/sagemaker_train.py "$@" ;;
  version) head -n 1 "$RELEASE/VERSION" ;;
  help | --help | -h | "") usage ;;
  *)
    echo "paramserver: unknown command '$command'" >&2
    usage >&2
    exit 2
    ;;
esac
