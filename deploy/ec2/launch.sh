#!/usr/bin/env bash
# Launches, resizes, watches and tears down one paramserver cluster on EC2 with the AWS
# CLI (Debian's awscli). `launch.sh --help` and `launch.sh COMMAND --help` describe every
# option; docs/DEPLOY_EC2.md walks through a whole job. What `up` makes, all named after
# --name and tagged Cluster=<name>, and what `down` removes again:
#   - SSM Parameter Store SecureStrings /paramserver/<name>/: cluster-token, admin-token,
#     and with --tls tls-ca, tls-cert, tls-key (made here; handed to the CLI as files,
#     never on a command line; read at boot by each instance with its role);
#   - an IAM role and instance profile ps-<name>-node whose policy grants exactly: those
#     parameters, KMS decryption through SSM only, the spec's s3:// prefixes, this
#     cluster's log group, CloudWatch metrics in the paramserver namespaces, and SSM
#     sessions (AmazonSSMManagedInstanceCore, for port forwarding and `status`);
#   - a security group ps-<name> opening the cluster's ports to its members only;
#   - a cluster placement group ps-<name> for the servers (where the family allows one);
#   - a CloudWatch log group /paramserver/<name>;
#   - the scheduler and `cluster.servers` servers: on-demand instances;
#   - a launch template ps-<name>-worker and an Auto Scaling group ps-<name>-workers of
#     `cluster.workers` workers: spot by default (mixed instance types, capacity
#     rebalancing), so a reclaimed worker is replaced and the newcomer takes its rank.
# Each instance boots with deploy/ec2/cloud-init.yaml.tmpl and deploy/ec2/ps-bootstrap.sh.
# --dry-run prints the AWS CLI calls instead of making them; where one call's output
# feeds a later one, a made-up value stands in for it (sg-DRYRUN, 10.0.0.10).
set -euo pipefail
exec 3>&1  # the dry run prints its calls here (stdout), not into $(...)
HERE=$(cd "$(dirname "$0")" && pwd)
PROGRAM=launch.sh

usage() {
  cat <<'USAGE'
usage: launch.sh COMMAND [OPTIONS]     (launch.sh COMMAND --help for its options)

Commands:
  up      start a cluster from a spec: secrets, IAM, network, scheduler, servers, workers
  down    remove everything `up` made for a cluster, its secrets included
  scale   change the number of workers (the Auto Scaling group's size) or of servers
  status  the cluster's instances, their roles and health, and the job's progress
  policy  print the IAM policy the instances need (for --instance-profile)

Every command takes --name NAME (the cluster), --region R (default: AWS_REGION or
AWS_DEFAULT_REGION) and --dry-run (print the AWS CLI calls, make none).
USAGE
}

up_usage() {
  cat <<'USAGE'
usage: launch.sh up --spec FILE --name NAME --release-url URL --vpc VPC --subnet SUBNET[,SUBNET...]
                    [options]

Required:
  --spec FILE              the cluster spec (YAML); its cluster.servers and cluster.workers
                           set the counts, its s3:// paths the S3 access the instances get
  --name NAME              the cluster's name (letters, digits, '-'): tags, resource names
  --release-url URL        where instances download the release (deploy/package.sh's tarball)
  --vpc VPC                the VPC
  --subnet S[,S...]        subnets that reach the internet (through a NAT gateway, or
                           public ones with --public-ip); the scheduler and the servers go in
                           the first, the workers' group spreads over all

Instances:
  --ami AMI                the image (default debian-12: the newest official Debian 12
                           amd64 AMI, owner 136693071363, looked up in the region)
  --scheduler-type T       default t3.medium
  --server-type T          default r6i.xlarge (on-demand; in a cluster placement group
                           unless the family is burstable t*)
  --worker-types T[,T...]  default g5.xlarge; several types let the group find spot capacity
                           (GPU families g*/p* also get the NVIDIA driver)
  --worker-market M        spot (default) or on-demand
  --public-ip              give every instance a public address (subnets without NAT)
  --key-name KEY           an EC2 key pair for SSH (SSM sessions need none)

Resuming a lost job:
  --resume                 start the job from the newest complete checkpoint in the spec's
                           checkpoint.dir (it must be s3://: the instances' disks go with
                           them) instead of from scratch: the spec the instances get says
                           checkpoint.resume: true. Refused when the prefix holds no
                           checkpoint. For a job whose every instance was lost (a spot
                           reclaim of the fleet, a zone outage, `down` at night)

Access and operations:
  --instance-profile P     use this existing instance profile instead of creating
                           ps-NAME-node (give it what `launch.sh policy` prints)
  --tls                    also make a CA and a certificate (openssl) and run every
                           connection with mutual TLS
  --log-retention-days N   the log group's retention (default 14)
  --region R               the region (default AWS_REGION or AWS_DEFAULT_REGION)
  --work DIR               keep the rendered user data and policies here
  --dry-run                print the AWS CLI calls instead of making them
USAGE
}

down_usage() {
  cat <<'USAGE'
usage: launch.sh down --name NAME [--region R] [--keep-logs] [--dry-run]

Deletes the workers' group and launch template, terminates the scheduler and servers,
and deletes the placement group, the security group, the log group (not with
--keep-logs), the SSM parameters (the tokens and TLS material) and the IAM role and
instance profile. Objects in S3 (checkpoints, weights) are left alone.
USAGE
}

scale_usage() {
  cat <<'USAGE'
usage: launch.sh scale --name NAME --workers N [--region R] [--dry-run]
       launch.sh scale --name NAME --servers N [--region R] [--dry-run]

Sets the workers' Auto Scaling group to N instances (0 <= N <= the spec's cluster.workers,
or its max for a range {min, max}: the group's maximum; the group's minimum follows N).
What the job does:
  fewer workers  the removed ones leave the job; sync steps complete without them (with
                 data.sharding: dynamic their leases' rest goes to the others; with fixed
                 ranges their share of the data is skipped), async and ssp go on
  more workers   each new one takes a vacant rank (a worker that left or died), or a new
                 rank up to the range's max, and trains at once: sync steps average over
                 the workers present (the effective batch grows)
A worker beyond cluster.workers' max has no rank to take: the scheduler turns it away.

--servers N adds or removes servers (on-demand instances) while the job trains:
  more servers   starts instances like the running servers (their image, type, subnet,
                 security group, role, placement group and user data); each joins the
                 job in a new slot, up to the spec's cluster.servers max ({min, max}),
                 and takes a fair share of the shards live (a server beyond the max is
                 turned away and exits)
  fewer servers  runs `psctl scale --servers N` on the scheduler (SSM Run Command): the
                 highest-ranked servers are drained one after the other, their shards
                 moving with their state; then terminates the instances that left
USAGE
}

status_usage() {
  cat <<'USAGE'
usage: launch.sh status --name NAME [--region R] [--no-job] [--dry-run]

Lists the cluster's instances (id, role, type, spot or on-demand, state, private address),
the workers' group (desired and in service), and the job's progress: `psctl status` run on
the scheduler instance through SSM Run Command (skipped with --no-job).
USAGE
}

policy_usage() {
  cat <<'USAGE'
usage: launch.sh policy --name NAME --spec FILE [--region R] [--account ID]

Prints the IAM policy (JSON) an instance profile of this cluster needs: its SSM
parameters, KMS decryption through SSM, the spec's s3:// prefixes, its log group and
CloudWatch metrics. `up` attaches it to the role it makes.
USAGE
}

fail() { echo "$PROGRAM: $*" >&2; exit 2; }

ACTION=${1:-}
case "$ACTION" in
  up | down | scale | status | policy) shift ;;
  -h | --help | help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
  *) echo "$PROGRAM: unknown command '$ACTION'" >&2; usage >&2; exit 2 ;;
esac

SPEC="" NAME="" AMI=debian-12 VPC="" SUBNETS="" PROFILE="" RELEASE_URL="" KEY_NAME="" WORK=""
REGION=${AWS_REGION:-${AWS_DEFAULT_REGION:-}} ACCOUNT="" DRY_RUN=0 TLS=0 PUBLIC_IP=0
SCHEDULER_TYPE=t3.medium SERVER_TYPE=r6i.xlarge WORKER_TYPES=g5.xlarge WORKER_MARKET=spot
LOG_RETENTION=14 KEEP_LOGS=0 WORKERS_WANTED="" SERVERS_WANTED="" JOB=1 RESUME=0
while (($#)); do
  case "$1" in
    -h | --help) "${ACTION}_usage"; exit 0 ;;
    --spec) SPEC=$2; shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    --ami) AMI=$2; shift 2 ;;
    --vpc) VPC=$2; shift 2 ;;
    --subnet) SUBNETS=$2; shift 2 ;;
    --instance-profile) PROFILE=$2; shift 2 ;;
    --release-url) RELEASE_URL=$2; shift 2 ;;
    --scheduler-type) SCHEDULER_TYPE=$2; shift 2 ;;
    --server-type) SERVER_TYPE=$2; shift 2 ;;
    --worker-types | --worker-type) WORKER_TYPES=$2; shift 2 ;;
    --worker-market) WORKER_MARKET=$2; shift 2 ;;
    --spot-workers) WORKER_MARKET=spot; shift ;;
    --public-ip) PUBLIC_IP=1; shift ;;
    --key-name) KEY_NAME=$2; shift 2 ;;
    --tls) TLS=1; shift ;;
    --resume) RESUME=1; shift ;;
    --log-retention-days) LOG_RETENTION=$2; shift 2 ;;
    --keep-logs) KEEP_LOGS=1; shift ;;
    --workers) WORKERS_WANTED=$2; shift 2 ;;
    --servers) SERVERS_WANTED=$2; shift 2 ;;
    --no-job) JOB=0; shift ;;
    --account) ACCOUNT=$2; shift 2 ;;
    --region) REGION=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) echo "$PROGRAM $ACTION: unknown argument $1 (launch.sh $ACTION --help lists them)" >&2; exit 2 ;;
  esac
done
[[ -n $NAME ]] || fail "--name is required"
[[ $NAME =~ ^[a-zA-Z0-9-]{1,40}$ ]] || fail "--name may hold letters, digits and '-' only (at most 40)"
[[ -n $REGION ]] || fail "--region is required (or set AWS_REGION)"
REGION_ARGS=(--region "$REGION")
PARAMETERS="/paramserver/$NAME"
ROLE_NAME="ps-$NAME-node"
GROUP_NAME="ps-$NAME"
TEMPLATE_NAME="ps-$NAME-worker"
ASG_NAME="ps-$NAME-workers"
LOG_GROUP="/paramserver/$NAME"
SECRETS=(cluster-token admin-token tls-ca tls-cert tls-key)

# Runs (or, with --dry-run, prints) one AWS CLI call; prints the call's output, or
# `stand_in` (a made-up id or address) in a dry run.
aws_call() {
  local stand_in=$1
  shift
  if ((DRY_RUN)); then
    printf 'aws' >&3
    printf ' %q' "${REGION_ARGS[@]}" "$@" >&3
    printf '\n' >&3
    [[ -z $stand_in ]] || echo "$stand_in"
  else
    aws "${REGION_ARGS[@]}" "$@"
  fi
}

# The same for a call whose failure is reported and survived (teardown goes on).
FAILED_STEPS=()
aws_try() {
  local what=$1
  shift
  if ! aws_call "" "$@" >/dev/null 2>"$WORK/aws-error"; then
    FAILED_STEPS+=("$what: $(tail -n 1 "$WORK/aws-error")")
  fi
}

if [[ -z $WORK ]]; then WORK=$(mktemp -d); fi
mkdir -p "$WORK"

# cluster.KEY from the spec (a top-level `cluster:` block of `key: value` lines).
cluster_key() {
  awk -v key="$1" '/^cluster:/ {in_cluster = 1; next} /^[^ #]/ {in_cluster = 0}
    in_cluster && $1 == key ":" {print $2; exit}' "$SPEC"
}

# checkpoint.dir from the spec (its top-level `checkpoint:` block, block style, keys
# indented by two spaces as cluster_key reads them), quotes removed.
checkpoint_dir() {
  awk '/^checkpoint:/ {in_block = 1; next} /^[^ #]/ {in_block = 0}
    in_block && $1 == "dir:" {value = $2; gsub(/["\047]/, "", value); print value; exit}' "$SPEC"
}

# The spec as the instances get it: the scheduler's address filled in, and with --resume
# checkpoint.resume: true (the line replaced, or added to the checkpoint: block).
rendered_spec() {
  sed -E "s|^(  scheduler:).*|\1 $1|" "$SPEC" | awk -v resume="$RESUME" '
    function add() { if (in_block && !done) print "  resume: true"; done = done || in_block }
    resume == 1 && /^checkpoint:/ {print; in_block = 1; next}
    resume == 1 && in_block && /^  resume:/ {print "  resume: true"; done = 1; next}
    resume == 1 && in_block && /^[^ #]/ {add(); in_block = 0}
    {print}
    END {if (resume == 1) add()}'
}

# The s3:// prefixes the spec names, one "read|write BUCKET PREFIX" line each: the folder
# of a data file or init_from (read), of output.weights or output.report (write), and a
# checkpoint.dir itself (write: checkpoints are written, listed and pruned).
s3_prefixes() {
  awk '{
      for (i = 1; i <= NF; i++) if ($i ~ /s3:\/\//) {
        key = $1; sub(/:$/, "", key); uri = $i; gsub(/[",]/, "", uri); sub(/^s3:\/\//, "", uri)
        bucket = uri; sub(/\/.*/, "", bucket); path = substr(uri, length(bucket) + 2)
        if (key != "dir") sub(/\/?[^\/]*$/, "", path)
        mode = (key == "dir" || key == "weights" || key == "report") ? "write" : "read"
        print mode, bucket, path
      }
    }' "$SPEC" | sort -u
}

# The IAM policy of this cluster's instances (JSON).
policy_document() {
  local account=$1 s3_statements="" mode bucket prefix n=0 actions
  while read -r mode bucket prefix; do
    [[ -n $bucket ]] || continue
    n=$((n + 1))
    actions='"s3:GetObject"'
    [[ $mode == write ]] && actions='"s3:GetObject", "s3:PutObject", "s3:DeleteObject"'
    s3_statements+=$(cat <<S3
,
    {"Sid": "ListSpecPrefix$n", "Effect": "Allow", "Action": "s3:ListBucket",
     "Resource": "arn:aws:s3:::$bucket",
     "Condition": {"StringLike": {"s3:prefix": ["$prefix", "$prefix/*"]}}},
    {"Sid": "$([[ $mode == write ]] && echo ReadWrite || echo Read)SpecPrefix$n", "Effect": "Allow",
     "Action": [$actions], "Resource": "arn:aws:s3:::$bucket/${prefix:+$prefix/}*"}
S3
)
  done < <(s3_prefixes)
  cat <<POLICY
{
  "Version": "2012-10-17",
  "Statement": [
    {"Sid": "ReadThisClustersSecrets", "Effect": "Allow", "Action": "ssm:GetParameter",
     "Resource": "arn:aws:ssm:$REGION:$account:parameter$PARAMETERS/*"},
    {"Sid": "DecryptThroughSsmOnly", "Effect": "Allow", "Action": "kms:Decrypt",
     "Resource": "arn:aws:kms:$REGION:$account:key/*",
     "Condition": {"StringEquals": {"kms:ViaService": "ssm.$REGION.amazonaws.com"}}},
    {"Sid": "WriteThisClustersLogs", "Effect": "Allow",
     "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams", "logs:CreateLogGroup"],
     "Resource": ["arn:aws:logs:$REGION:$account:log-group:$LOG_GROUP:*",
                  "arn:aws:logs:$REGION:$account:log-group:$LOG_GROUP/prometheus:*"]},
    {"Sid": "PutParamserverMetrics", "Effect": "Allow", "Action": "cloudwatch:PutMetricData",
     "Resource": "*",
     "Condition": {"StringLike": {"cloudwatch:namespace": "paramserver*"}}},
    {"Sid": "CloudWatchAgentLookups", "Effect": "Allow",
     "Action": ["ec2:DescribeTags", "ec2:DescribeVolumes"], "Resource": "*"}$s3_statements
  ]
}
POLICY
}

account_id() {
  if [[ -n $ACCOUNT ]]; then echo "$ACCOUNT"; return; fi
  aws_call "123456789012" sts get-caller-identity --query Account --output text
}

if [[ $ACTION == policy ]]; then
  [[ -n $SPEC ]] || fail "--spec is required"
  [[ -r $SPEC ]] || fail "$SPEC: cannot read the spec"
  policy_document "$(account_id)"
  exit 0
fi

# ---------------------------------------------------------------- down
if [[ $ACTION == down ]]; then
  aws_try "delete the workers' group" autoscaling delete-auto-scaling-group \
    --auto-scaling-group-name "$ASG_NAME" --force-delete
  ids=$(aws_call "i-DRYRUN1 i-DRYRUN2" ec2 describe-instances \
    --filters "Name=tag:Cluster,Values=$NAME" "Name=instance-state-name,Values=pending,running,stopping,stopped" \
    --query "Reservations[].Instances[].InstanceId" --output text)
  if [[ -n ${ids// /} && $ids != None ]]; then
    # shellcheck disable=SC2086  # the ids are separate arguments
    aws_try "terminate the instances" ec2 terminate-instances --instance-ids $ids
    # shellcheck disable=SC2086
    aws_try "wait for them to end" ec2 wait instance-terminated --instance-ids $ids
  fi
  aws_try "delete the launch template" ec2 delete-launch-template --launch-template-name "$TEMPLATE_NAME"
  aws_try "delete the placement group" ec2 delete-placement-group --group-name "$GROUP_NAME"
  group=$(aws_call "sg-DRYRUN" ec2 describe-security-groups --filters "Name=group-name,Values=$GROUP_NAME" \
    --query "SecurityGroups[0].GroupId" --output text 2>/dev/null || true)
  [[ -z $group || $group == None ]] || aws_try "delete the security group" ec2 delete-security-group --group-id "$group"
  names=()
  for secret in "${SECRETS[@]}"; do names+=("$PARAMETERS/$secret"); done
  aws_try "delete the secrets" ssm delete-parameters --names "${names[@]}"
  aws_try "detach SSM sessions from the role" iam detach-role-policy --role-name "$ROLE_NAME" \
    --policy-arn arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore
  aws_try "delete the role's policy" iam delete-role-policy --role-name "$ROLE_NAME" --policy-name "$ROLE_NAME"
  aws_try "take the role out of the instance profile" iam remove-role-from-instance-profile \
    --instance-profile-name "$ROLE_NAME" --role-name "$ROLE_NAME"
  aws_try "delete the instance profile" iam delete-instance-profile --instance-profile-name "$ROLE_NAME"
  aws_try "delete the role" iam delete-role --role-name "$ROLE_NAME"
  ((KEEP_LOGS)) || aws_try "delete the log group" logs delete-log-group --log-group-name "$LOG_GROUP"
  echo "cluster $NAME: removed the workers' group $ASG_NAME, instances [${ids}], the launch template,"
  echo "  placement and security groups, the secrets under $PARAMETERS, the role $ROLE_NAME$( ((KEEP_LOGS)) || echo ", the log group $LOG_GROUP")"
  if ((${#FAILED_STEPS[@]})); then
    echo "not everything went (a resource `up` did not make, e.g. with --instance-profile, is expected here):"
    printf '  %s\n' "${FAILED_STEPS[@]}"
  fi
  exit 0
fi

# ---------------------------------------------------------------- scale --servers
# Runs `command` on the scheduler instance through SSM Run Command; its output.
run_on_scheduler() {
  local command=$1 scheduler command_id answer=""
  scheduler=$(aws_call "i-DRYRUN" ec2 describe-instances \
    --filters "Name=tag:Cluster,Values=$NAME" "Name=tag:Role,Values=scheduler" "Name=instance-state-name,Values=running" \
    --query 'Reservations[].Instances[].InstanceId' --output text)
  [[ -n $scheduler ]] || fail "no running scheduler instance in cluster $NAME"
  command_id=$(aws_call "cmd-DRYRUN" ssm send-command --instance-ids "$scheduler" \
    --document-name AWS-RunShellScript --comment "launch.sh scale" \
    --parameters "commands=[\"$command\"]" --query Command.CommandId --output text)
  for _ in $(seq 600); do
    answer=$(aws_call "Success	scale: 2 live servers" ssm get-command-invocation --command-id "$command_id" \
      --instance-id "$scheduler" --query "[Status,StandardOutputContent]" --output text 2>/dev/null || true)
    case "${answer%%$'\t'*}" in Pending | InProgress | Delayed | "") ((DRY_RUN)) || sleep 1 ;; *) break ;; esac
  done
  [[ ${answer%%$'\t'*} == Success ]] || fail "on the scheduler: $command: ${answer:-no answer}"
  echo "${answer#*$'\t'}"
}

if [[ $ACTION == scale && -n $SERVERS_WANTED ]]; then
  [[ -z $WORKERS_WANTED ]] || fail "scale takes --workers or --servers, not both"
  [[ $SERVERS_WANTED =~ ^[0-9]+$ ]] && ((SERVERS_WANTED >= 1)) || fail "--servers N needs a count >= 1"
  # The running servers: id and private address.
  servers=$(aws_call "i-DRYRUN-S	10.0.0.11" ec2 describe-instances \
    --filters "Name=tag:Cluster,Values=$NAME" "Name=tag:Role,Values=server" "Name=instance-state-name,Values=pending,running" \
    --query 'Reservations[].Instances[].[InstanceId, PrivateIpAddress]' --output text)
  count=$(grep -c . <<<"$servers" || true)
  ((count > 0)) || fail "no running server instance in cluster $NAME (is the cluster up?)"
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/ps-scale-$NAME.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  if ((SERVERS_WANTED > count)); then
    # Like the first running server: its launch settings and user data.
    template=$(head -n1 <<<"$servers" | cut -f1)
    # Tab-separated, empty fields kept (read would merge consecutive tabs).
    IFS=$'\037' read -r image type subnet group profile key placement public < <(aws_call \
      "ami-DRYRUN	c6i.large	subnet-DRYRUN	sg-DRYRUN	arn:aws:iam::1:instance-profile/ps-DRYRUN	None	None	None" \
      ec2 describe-instances --instance-ids "$template" \
      --query 'Reservations[0].Instances[0].[ImageId, InstanceType, SubnetId, SecurityGroups[0].GroupId, IamInstanceProfile.Arn, KeyName, Placement.GroupName, PublicIpAddress]' \
      --output text | tr '\t' '\037')
    [[ -n $image && -n $type ]] || fail "cannot read the launch settings of server $template"
    aws_call "$(printf 'dry run' | gzip -c | base64 -w0)" ec2 describe-instance-attribute --instance-id "$template" \
      --attribute userData --query UserData.Value --output text | base64 -d >"$WORK/user-data-server.yaml.gz" ||
      fail "cannot read the user data of server $template"
    args=(ec2 run-instances --image-id "$image" --instance-type "$type" --count "$((SERVERS_WANTED - count))"
          --iam-instance-profile "Arn=$profile" --subnet-id "$subnet" --security-group-ids "$group"
          --metadata-options "HttpTokens=required,HttpEndpoint=enabled"
          --tag-specifications "ResourceType=instance,Tags=[{Key=Cluster,Value=$NAME},{Key=Role,Value=server},{Key=Name,Value=ps-$NAME-server}]"
          --user-data "fileb://$WORK/user-data-server.yaml.gz")
    [[ $key == None || -z $key ]] || args+=(--key-name "$key")
    [[ $placement == None || -z $placement ]] || args+=(--placement "GroupName=$placement")
    [[ $public == None || -z $public ]] || args+=(--associate-public-ip-address)
    started=$(aws_call "i-DRYRUN-NEW" "${args[@]}" --query "Instances[].InstanceId" --output text)
    echo "cluster $NAME: servers $count -> $SERVERS_WANTED: started $started (on-demand $type, like $template)"
    echo "  each joins in a new slot, up to cluster.servers' max, and takes a fair share of the shards live"
  elif ((SERVERS_WANTED < count)); then
    psctl="PSCTL_CLUSTER_TOKEN_FILE=/etc/ps/cluster.token /opt/paramserver/bin/psctl --scheduler 127.0.0.1:7000 --token-file /etc/ps/admin.token"
    tls="if [ -d /etc/ps/tls ]; then t='--tls_ca /etc/ps/tls/ca.pem --tls_cert /etc/ps/tls/node.pem --tls_key /etc/ps/tls/node.key --tls_server_name paramserver'; fi"
    echo "cluster $NAME: servers $count -> $SERVERS_WANTED: draining on the scheduler (psctl scale)"
    # `nodes` runs even if the scale stopped partway: whatever was drained is terminated.
    run_on_scheduler "$tls; $psctl \$t --servers $SERVERS_WANTED scale 2>&1; $psctl \$t nodes" >"$WORK/scale.out"
    sed 's/^/  /' "$WORK/scale.out"
    # The drained servers' addresses (psctl nodes: NAME ROLE ADDRESS HEALTH ...), then
    # the instances at them.
    drained=$(awk '$2 == "server" && $4 == "drained" {split($3, a, ":"); print a[1]}' "$WORK/scale.out")
    ids=()
    while IFS=$'\t' read -r id address; do
      grep -qxF "$address" <<<"$drained" && ids+=("$id")
    done <<<"$servers"
    if ((${#ids[@]})); then
      aws_call "" ec2 terminate-instances --instance-ids "${ids[@]}" --output text >/dev/null
      echo "  terminated ${ids[*]} (drained)"
    fi
  else
    echo "cluster $NAME: $count servers already"
  fi
  exit 0
fi

# ---------------------------------------------------------------- scale
if [[ $ACTION == scale ]]; then
  [[ $WORKERS_WANTED =~ ^[0-9]+$ ]] || fail "--workers N or --servers N is required (a count)"
  read -r max desired < <(aws_call "4 4" autoscaling describe-auto-scaling-groups \
    --auto-scaling-group-names "$ASG_NAME" --query "AutoScalingGroups[0].[MaxSize,DesiredCapacity]" --output text)
  [[ $max =~ ^[0-9]+$ ]] || fail "no workers' group $ASG_NAME in $REGION (is the cluster up?)"
  if ((WORKERS_WANTED > max)); then
    fail "the spec has $max worker ranks (cluster.workers, a range's max); a worker beyond them has no rank to take and would be turned away"
  fi
  aws_call "" autoscaling update-auto-scaling-group --auto-scaling-group-name "$ASG_NAME" \
    --min-size "$WORKERS_WANTED" --desired-capacity "$WORKERS_WANTED"
  echo "cluster $NAME: workers $desired -> $WORKERS_WANTED (of $max ranks)"
  if ((WORKERS_WANTED < desired)); then
    echo "  the removed workers leave the job; sync steps complete without them, skipping their share of the data"
  elif ((WORKERS_WANTED > desired)); then
    echo "  each new worker takes a vacant rank, or a new one up to cluster.workers' max, and trains at once (sync: each step's mean is over the workers present)"
  fi
  exit 0
fi

# ---------------------------------------------------------------- status
if [[ $ACTION == status ]]; then
  instances=$(aws_call "i-DRYRUN	scheduler	t3.medium	on-demand	running	10.0.0.10" ec2 describe-instances \
    --filters "Name=tag:Cluster,Values=$NAME" "Name=instance-state-name,Values=pending,running,stopping,stopped" \
    --query 'Reservations[].Instances[].[InstanceId, Tags[?Key==`Role`]|[0].Value, InstanceType, InstanceLifecycle || `on-demand`, State.Name, PrivateIpAddress]' \
    --output text)
  echo "cluster $NAME ($REGION)"
  { echo "INSTANCE	ROLE	TYPE	MARKET	STATE	ADDRESS"; echo "$instances" | sort -t$'\t' -k2,2 -k1,1; } | column -t -s$'\t'
  read -r min max desired in_service < <(aws_call "4 4 4 4" autoscaling describe-auto-scaling-groups \
    --auto-scaling-group-names "$ASG_NAME" \
    --query "AutoScalingGroups[0].[MinSize,MaxSize,DesiredCapacity,length(Instances[?LifecycleState=='InService'])]" \
    --output text) || true
  echo "workers' group $ASG_NAME: ${in_service:-?} in service of ${desired:-?} wanted (max ${max:-?})"
  scheduler=$(awk -F'\t' '$2 == "scheduler" && $5 == "running" {print $1; exit}' <<<"$instances")
  if ((JOB)) && [[ -n $scheduler ]]; then
    psctl="PSCTL_CLUSTER_TOKEN_FILE=/etc/ps/cluster.token /opt/paramserver/bin/psctl --scheduler 127.0.0.1:7000"
    command_id=$(aws_call "cmd-DRYRUN" ssm send-command --instance-ids "$scheduler" \
      --document-name AWS-RunShellScript --comment "launch.sh status" \
      --parameters "commands=[\"if [ -d /etc/ps/tls ]; then $psctl --tls_ca /etc/ps/tls/ca.pem --tls_cert /etc/ps/tls/node.pem --tls_key /etc/ps/tls/node.key --tls_server_name paramserver status; else $psctl status; fi\"]" \
      --query Command.CommandId --output text)
    answer=""
    for _ in $(seq 30); do
      answer=$(aws_call "Success	training" ssm get-command-invocation --command-id "$command_id" \
        --instance-id "$scheduler" --query "[Status,StandardOutputContent]" --output text 2>/dev/null || true)
      case "${answer%%$'\t'*}" in Pending | InProgress | Delayed | "") ((DRY_RUN)) || sleep 1 ;; *) break ;; esac
    done
    echo "job (psctl status on the scheduler):"
    sed 's/^/  /' <<<"${answer#*$'\t'}"
  fi
  exit 0
fi

# ---------------------------------------------------------------- up
for required in SPEC VPC SUBNETS RELEASE_URL; do
  option=$(tr 'A-Z_' 'a-z-' <<<"$required")
  [[ $option == subnets ]] && option=subnet
  [[ -n ${!required} ]] || fail "--$option is required (launch.sh up --help lists every option)"
done
[[ -r $SPEC ]] || fail "$SPEC: cannot read the spec"
[[ $WORKER_MARKET == spot || $WORKER_MARKET == on-demand ]] || fail "--worker-market is spot or on-demand, not $WORKER_MARKET"
# cluster.KEY as "MIN MAX": a count N is "N N", a flow-style range {min: N, max: M} "N M"
# (the job starts with min); unset, the default 2.
cluster_count_range() {
  local value
  value=$(cluster_key "$1")
  if [[ -z $value ]] && grep -Eq "^  $1: *(#.*)?\$" "$SPEC"; then
    fail "$SPEC: write cluster.$1 on one line, as a count or {min: N, max: M}"
  fi
  if [[ $value == "{"* ]]; then
    awk -v key="$1:" '/^cluster:/ {in_cluster = 1; next} /^[^ #]/ {in_cluster = 0}
      in_cluster && $1 == key {
        low = ""; high = ""
        if (match($0, /min: *[0-9]+/)) {low = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", low)}
        if (match($0, /max: *[0-9]+/)) {high = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", high)}
        print low, (high == "" ? low : high); exit}' "$SPEC"
  else
    echo "${value:-2} ${value:-2}"
  fi
}
read -r SERVERS _ < <(cluster_count_range servers)
read -r WORKERS WORKERS_MAX < <(cluster_count_range workers)
[[ $SERVERS =~ ^[0-9]+$ && $WORKERS =~ ^[0-9]+$ && $WORKERS_MAX =~ ^[0-9]+$ ]] ||
  fail "cannot read cluster.servers/workers from $SPEC"
[[ -n $(cluster_key scheduler) ]] ||
  fail "$SPEC: cluster.scheduler must be on a line of its own in a block-style cluster: section (the launcher fills in the scheduler's address there)"
IFS=, read -r -a SUBNET_LIST <<<"$SUBNETS"
IFS=, read -r -a WORKER_TYPE_LIST <<<"$WORKER_TYPES"
FIRST_SUBNET=${SUBNET_LIST[0]}
# Paths in the spec are read on the instances, where only /var/lib/ps is writable.
relative=$(awk '$1 ~ /^(weights|report|dir|tensorboard_dir):$/ {
    value = $2; gsub(/"/, "", value)
    if (value != "" && value !~ /^\// && value !~ /^s3:\/\//) print $1 " " value
  }' "$SPEC")
if [[ -n $relative ]]; then
  echo "$PROGRAM: warning: $SPEC names relative output paths ($(tr '\n' ' ' <<<"$relative")); on the instances they resolve under /etc/ps, which the units cannot write: give /var/lib/ps/... or s3://... (the daemons refuse them at start)" >&2
fi

if ((RESUME)); then
  CHECKPOINTS=$(checkpoint_dir)
  [[ $CHECKPOINTS == s3://* ]] ||
    fail "--resume: checkpoint.dir must be an s3:// prefix (the instances' own disks are lost with them); $SPEC has '${CHECKPOINTS}'"
  # Completeness (every shard at one step) is the scheduler's to check at start.
  listed=""
  ((DRY_RUN)) || listed=$(aws "${REGION_ARGS[@]}" s3 ls "${CHECKPOINTS%/}/" 2>/dev/null || true)
  if ((!DRY_RUN)) && ! grep -Eq ' shard-[0-9]+-step-[0-9]+\.ckpt$' <<<"$listed"; then
    fail "--resume: ${CHECKPOINTS%/}/ holds no checkpoint (shard-N-step-S.ckpt) to resume from"
  fi
fi

ACCOUNT_ID=$(account_id)
if [[ $AMI == debian-12 ]]; then
  AMI=$(aws_call "ami-DRYRUN" ec2 describe-images --owners 136693071363 \
    --filters "Name=name,Values=debian-12-amd64-*" "Name=state,Values=available" \
    --query "sort_by(Images, &CreationDate)[-1].ImageId" --output text)
  [[ $AMI == ami-* ]] || fail "found no Debian 12 AMI in $REGION; give --ami"
fi

# 1. The secrets: made here, stored encrypted in SSM, handed to the CLI as files (other
# users of this machine see command lines), the files removed once stored.
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$WORK/cluster-token" &&
  od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$WORK/admin-token")
secrets=(cluster-token admin-token)
if ((TLS)); then
  (umask 077 && cd "$WORK" &&
    openssl req -x509 -newkey rsa:3072 -nodes -days 365 -subj "/CN=paramserver $NAME CA" \
      -keyout ca.key -out tls-ca 2>/dev/null &&
    openssl req -newkey rsa:3072 -nodes -subj "/CN=paramserver" -keyout tls-key -out node.csr 2>/dev/null &&
    printf 'subjectAltName=DNS:paramserver\nextendedKeyUsage=serverAuth,clientAuth\n' >node.ext &&
    openssl x509 -req -in node.csr -CA tls-ca -CAkey ca.key -CAcreateserial -days 365 \
      -extfile node.ext -out tls-cert 2>/dev/null && rm -f ca.key node.csr node.ext tls-ca.srl)
  secrets+=(tls-ca tls-cert tls-key)
fi
for secret in "${secrets[@]}"; do
  aws_call "" ssm put-parameter --name "$PARAMETERS/$secret" --type SecureString --overwrite \
    --value "file://$WORK/$secret" --output text >/dev/null
done
rm -f "$WORK"/cluster-token "$WORK"/admin-token "$WORK"/tls-ca "$WORK"/tls-cert "$WORK"/tls-key

# 2. The instances' role, scoped to this cluster.
if [[ -z $PROFILE ]]; then
  PROFILE=$ROLE_NAME
  cat >"$WORK/trust.json" <<'TRUST'
{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
TRUST
  policy_document "$ACCOUNT_ID" >"$WORK/policy.json"
  aws_call "" iam create-role --role-name "$ROLE_NAME" --assume-role-policy-document "file://$WORK/trust.json" \
    --tags "Key=Cluster,Value=$NAME" --output text >/dev/null
  aws_call "" iam put-role-policy --role-name "$ROLE_NAME" --policy-name "$ROLE_NAME" \
    --policy-document "file://$WORK/policy.json"
  aws_call "" iam attach-role-policy --role-name "$ROLE_NAME" \
    --policy-arn arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore
  aws_call "" iam create-instance-profile --instance-profile-name "$ROLE_NAME" --output text >/dev/null
  aws_call "" iam add-role-to-instance-profile --instance-profile-name "$ROLE_NAME" --role-name "$ROLE_NAME"
  aws_call "" iam wait instance-profile-exists --instance-profile-name "$ROLE_NAME"
fi

# run-instances, retried while IAM has not yet spread the new instance profile (it
# takes a few seconds after it exists: "Invalid IAM Instance Profile name").
run_instances() {
  local attempt output
  for attempt in 1 2 3 4 5 6 7 8; do
    if output=$(aws_call "$@" 2>"$WORK/run-instances.err"); then
      echo "$output"
      return 0
    fi
    grep -q "Invalid IAM Instance Profile" "$WORK/run-instances.err" || break
    sleep 5
  done
  cat "$WORK/run-instances.err" >&2
  return 1
}

# 3. The network: the cluster's ports open to its members only.
GROUP=$(aws_call "sg-DRYRUN" ec2 create-security-group --group-name "$GROUP_NAME" \
  --description "paramserver cluster $NAME: its ports, open only to its members" --vpc-id "$VPC" \
  --tag-specifications "ResourceType=security-group,Tags=[{Key=Cluster,Value=$NAME}]" \
  --query GroupId --output text)
aws_call "" ec2 authorize-security-group-ingress --group-id "$GROUP" \
  --ip-permissions "IpProtocol=tcp,FromPort=7000,ToPort=7002,UserIdGroupPairs=[{GroupId=$GROUP}]" \
  "IpProtocol=tcp,FromPort=9100,ToPort=9102,UserIdGroupPairs=[{GroupId=$GROUP}]" --output text >/dev/null
PLACEMENT=()
if [[ $SERVER_TYPE != t* ]]; then
  aws_call "" ec2 create-placement-group --group-name "$GROUP_NAME" --strategy cluster \
    --tag-specifications "ResourceType=placement-group,Tags=[{Key=Cluster,Value=$NAME}]" --output text >/dev/null
  PLACEMENT=(--placement "GroupName=$GROUP_NAME")
fi
aws_call "" logs create-log-group --log-group-name "$LOG_GROUP" --tags "Cluster=$NAME"
aws_call "" logs put-retention-policy --log-group-name "$LOG_GROUP" --retention-in-days "$LOG_RETENTION"

# 4. The user data of `role`, its spec naming the scheduler at `scheduler`.
is_gpu_type() { [[ $1 =~ ^(g[0-9]|p[0-9]) ]]; }
render_user_data() {
  local role=$1 scheduler=$2 gpu=0 port
  case "$role" in scheduler) port=9100 ;; server) port=9101 ;; worker) port=9102 ;; esac
  if [[ $role == worker ]]; then
    for type in "${WORKER_TYPE_LIST[@]}"; do is_gpu_type "$type" && gpu=1; done
  fi
  local env spec bootstrap
  env=$(printf 'CLUSTER=%s\nROLE=%s\nREGION=%s\nRELEASE_URL=%q\nPARAMETERS=%s\nGPU=%s\nTLS=%s\nLOG_GROUP=%s\nMETRICS_PORT=%s\n' \
    "$NAME" "$role" "$REGION" "$RELEASE_URL" "$PARAMETERS" "$gpu" "$TLS" "$LOG_GROUP" "$port" | base64 -w0)
  spec=$(rendered_spec "$scheduler" | base64 -w0)
  bootstrap=$(base64 -w0 "$HERE/ps-bootstrap.sh")
  sed -e "s|@BOOTSTRAP_ENV_B64@|$env|" -e "s|@CLUSTER_YAML_B64@|$spec|" -e "s|@BOOTSTRAP_B64@|$bootstrap|" \
    "$HERE/cloud-init.yaml.tmpl" >"$WORK/user-data-$role.yaml"
  # EC2 takes at most 16 KB of user data: cloud-init reads it gzipped as well.
  gzip -9 -n -c "$WORK/user-data-$role.yaml" >"$WORK/user-data-$role.yaml.gz"
  echo "$WORK/user-data-$role.yaml.gz"
}

instance_args() {  # role, type, count
  local args=(ec2 run-instances --image-id "$AMI" --instance-type "$2" --count "$3"
              --iam-instance-profile "Name=$PROFILE"
              --metadata-options "HttpTokens=required,HttpEndpoint=enabled"
              --tag-specifications "ResourceType=instance,Tags=[{Key=Cluster,Value=$NAME},{Key=Role,Value=$1},{Key=Name,Value=ps-$NAME-$1}]")
  if ((PUBLIC_IP)); then
    args+=(--network-interfaces "DeviceIndex=0,SubnetId=$FIRST_SUBNET,Groups=$GROUP,AssociatePublicIpAddress=true")
  else
    args+=(--subnet-id "$FIRST_SUBNET" --security-group-ids "$GROUP")
  fi
  [[ -z $KEY_NAME ]] || args+=(--key-name "$KEY_NAME")
  printf '%s\n' "${args[@]}"
}

# 5. The scheduler and the servers: on-demand.
mapfile -t args < <(instance_args scheduler "$SCHEDULER_TYPE" 1)
SCHEDULER_IP=$(run_instances "10.0.0.10" "${args[@]}" --user-data "fileb://$(render_user_data scheduler 0.0.0.0:7000)" \
  --query "Instances[0].PrivateIpAddress" --output text)
mapfile -t args < <(instance_args server "$SERVER_TYPE" "$SERVERS")
SERVER_IDS=$(run_instances "i-DRYRUN-S" "${args[@]}" "${PLACEMENT[@]}" \
  --user-data "fileb://$(render_user_data server "$SCHEDULER_IP:7000")" \
  --query "Instances[].InstanceId" --output text)

# 6. The workers: a launch template and an Auto Scaling group over every subnet.
worker_user_data=$(base64 -w0 "$(render_user_data worker "$SCHEDULER_IP:7000")")
network='"SecurityGroupIds": ["'"$GROUP"'"]'
if ((PUBLIC_IP)); then
  network='"NetworkInterfaces": [{"DeviceIndex": 0, "AssociatePublicIpAddress": true, "Groups": ["'"$GROUP"'"]}]'
fi
cat >"$WORK/launch-template.json" <<TEMPLATE
{
  "ImageId": "$AMI",
  "InstanceType": "${WORKER_TYPE_LIST[0]}",
  "IamInstanceProfile": {"Name": "$PROFILE"},
  $network,
  "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
  "UserData": "$worker_user_data",$([[ -z $KEY_NAME ]] || echo "
  \"KeyName\": \"$KEY_NAME\",")
  "TagSpecifications": [{"ResourceType": "instance", "Tags": [
    {"Key": "Cluster", "Value": "$NAME"}, {"Key": "Role", "Value": "worker"},
    {"Key": "Name", "Value": "ps-$NAME-worker"}]}]
}
TEMPLATE
aws_call "" ec2 create-launch-template --launch-template-name "$TEMPLATE_NAME" \
  --launch-template-data "file://$WORK/launch-template.json" \
  --tag-specifications "ResourceType=launch-template,Tags=[{Key=Cluster,Value=$NAME}]" --output text >/dev/null
overrides=""
for type in "${WORKER_TYPE_LIST[@]}"; do overrides+="${overrides:+, }{\"InstanceType\": \"$type\"}"; done
on_demand_percent=0
[[ $WORKER_MARKET == on-demand ]] && on_demand_percent=100
cat >"$WORK/mixed-instances.json" <<MIXED
{
  "LaunchTemplate": {
    "LaunchTemplateSpecification": {"LaunchTemplateName": "$TEMPLATE_NAME", "Version": "\$Latest"},
    "Overrides": [$overrides]
  },
  "InstancesDistribution": {
    "OnDemandBaseCapacity": 0,
    "OnDemandPercentageAboveBaseCapacity": $on_demand_percent,
    "SpotAllocationStrategy": "price-capacity-optimized"
  }
}
MIXED
aws_call "" autoscaling create-auto-scaling-group --auto-scaling-group-name "$ASG_NAME" \
  --min-size "$WORKERS" --max-size "$WORKERS_MAX" --desired-capacity "$WORKERS" \
  --vpc-zone-identifier "$SUBNETS" --capacity-rebalance \
  --mixed-instances-policy "file://$WORK/mixed-instances.json" \
  --tags "ResourceId=$ASG_NAME,ResourceType=auto-scaling-group,Key=Cluster,Value=$NAME,PropagateAtLaunch=true"

cat <<SUMMARY
cluster $NAME started in $REGION (user data, policy and templates in $WORK):
  secrets         SSM SecureStrings $PARAMETERS/{$(IFS=,; echo "${secrets[*]}")}
  instance role   $PROFILE$([[ $PROFILE == "$ROLE_NAME" ]] && echo " (made here; its policy: $WORK/policy.json)")
  security group  $GROUP (tcp 7000-7002 and 9100-9102 from its members only)
  scheduler       1 x $SCHEDULER_TYPE (on-demand) at $SCHEDULER_IP:7000
  servers         $SERVERS x $SERVER_TYPE (on-demand$( ((${#PLACEMENT[@]})) && echo ", placement group $GROUP_NAME")): $SERVER_IDS
  workers         $WORKERS x ${WORKER_TYPES//,/ or } ($WORKER_MARKET, group $ASG_NAME, capacity rebalancing$( ((WORKERS_MAX > WORKERS)) && echo ", scales to $WORKERS_MAX"))
  logs            CloudWatch log group $LOG_GROUP; metrics in the namespaces paramserver, paramserver/host$( ((RESUME)) && printf '\n  resumes from    the newest complete checkpoint in %s' "$CHECKPOINTS")
watch it:  deploy/ec2/launch.sh status --name $NAME --region $REGION
admin:     aws ssm get-parameter --region $REGION --with-decryption --name $PARAMETERS/admin-token --query Parameter.Value --output text > admin.token
stop it:   deploy/ec2/launch.sh down --name $NAME --region $REGION
SUMMARY
