#!/usr/bin/env bash
# Starts (or tears down) the EC2 instances of one cluster spec with the AWS CLI: a
# security group that opens the cluster's ports only to its own members, one scheduler
# instance, `cluster.servers` server instances and `cluster.workers` worker instances,
# each tagged Cluster=<name> and Role=<role>, each with cloud-init user data that installs
# the release and starts its role's systemd unit (deploy/ec2/cloud-init.yaml.tmpl).
# A fresh cluster token (docs/SECURITY.md) is stored as the SSM SecureString parameter
# /paramserver/<name>/cluster-token; each instance reads it at boot with its role (the
# profile needs ssm:GetParameter on it, and kms:Decrypt on the aws/ssm key) into
# /etc/ps/cluster.token (root:ps, 0640). `down` deletes the parameter.
#
#   launch.sh up --spec cluster.yaml --name NAME --ami AMI --vpc VPC --subnet SUBNET \
#       --instance-profile PROFILE --release-url URL [--scheduler-type T] [--server-type T] \
#       [--worker-type T] [--key-name KEY] [--spot-workers] [--region R] [--work DIR] [--dry-run]
#   launch.sh down --name NAME [--region R] [--dry-run]
#
# --dry-run prints the exact AWS CLI calls instead of making them (with placeholder ids
# where a call's output feeds a later one). The rendered user data stays in --work DIR.
set -euo pipefail
exec 3>&1  # the dry run prints its calls here (stdout), not into $(...)
HERE=$(cd "$(dirname "$0")" && pwd)
ACTION=${1:-}
[[ $ACTION == up || $ACTION == down ]] || { echo "usage: launch.sh up|down ... (see the header)" >&2; exit 2; }
shift
SPEC="" NAME="" AMI="" VPC="" SUBNET="" PROFILE="" RELEASE_URL="" KEY_NAME="" REGION="" WORK="" DRY_RUN=0 SPOT=0
SCHEDULER_TYPE=t3.medium SERVER_TYPE=r6i.xlarge WORKER_TYPE=g5.xlarge
while (($#)); do
  case "$1" in
    --spec) SPEC=$2; shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    --ami) AMI=$2; shift 2 ;;
    --vpc) VPC=$2; shift 2 ;;
    --subnet) SUBNET=$2; shift 2 ;;
    --instance-profile) PROFILE=$2; shift 2 ;;
    --release-url) RELEASE_URL=$2; shift 2 ;;
    --scheduler-type) SCHEDULER_TYPE=$2; shift 2 ;;
    --server-type) SERVER_TYPE=$2; shift 2 ;;
    --worker-type) WORKER_TYPE=$2; shift 2 ;;
    --key-name) KEY_NAME=$2; shift 2 ;;
    --spot-workers) SPOT=1; shift ;;
    --region) REGION=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) echo "launch.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $NAME ]] || { echo "launch.sh: --name is required" >&2; exit 2; }
[[ $NAME =~ ^[a-zA-Z0-9-]+$ ]] || { echo "launch.sh: --name may hold letters, digits and '-' only" >&2; exit 2; }
REGION_ARGS=()
[[ -z $REGION ]] || REGION_ARGS=(--region "$REGION")

# Runs (or, with --dry-run, prints) one AWS CLI call; prints the call's output, or
# `placeholder` in a dry run.
aws_call() {
  local placeholder=$1
  shift
  if ((DRY_RUN)); then
    printf 'aws' >&3
    printf ' %q' "${REGION_ARGS[@]}" "$@" >&3
    printf '\n' >&3
    [[ -z $placeholder ]] || echo "$placeholder"
  else
    aws "${REGION_ARGS[@]}" "$@"
  fi
}

if [[ $ACTION == down ]]; then
  ids=$(aws_call "i-DRYRUN1 i-DRYRUN2" ec2 describe-instances \
    --filters "Name=tag:Cluster,Values=$NAME" "Name=instance-state-name,Values=pending,running,stopping,stopped" \
    --query "Reservations[].Instances[].InstanceId" --output text)
  if [[ -n ${ids// /} ]]; then
    # shellcheck disable=SC2086  # the ids are separate arguments
    aws_call "" ec2 terminate-instances --instance-ids $ids --output text >/dev/null
    # shellcheck disable=SC2086
    aws_call "" ec2 wait instance-terminated --instance-ids $ids
  fi
  group=$(aws_call "sg-DRYRUN" ec2 describe-security-groups --filters "Name=group-name,Values=ps-$NAME" \
    --query "SecurityGroups[0].GroupId" --output text)
  [[ -z $group || $group == None ]] || aws_call "" ec2 delete-security-group --group-id "$group"
  aws_call "" ssm delete-parameter --name "/paramserver/$NAME/cluster-token" >/dev/null 2>&1 || true
  echo "cluster $NAME: terminated instances [${ids}]; deleted security group ${group} and the cluster token"
  exit 0
fi

for required in SPEC AMI VPC SUBNET PROFILE RELEASE_URL; do
  [[ -n ${!required} ]] || { echo "launch.sh: --$(tr 'A-Z_' 'a-z-' <<<"$required") is required" >&2; exit 2; }
done
# cluster.servers and cluster.workers from the spec (their defaults: 2 and 2).
count_of() {
  awk -v key="$1" '/^cluster:/ {in_cluster = 1; next} /^[^ #]/ {in_cluster = 0}
    in_cluster && $1 == key ":" {print $2; exit}' "$SPEC"
}
SERVERS=$(count_of servers)
WORKERS=$(count_of workers)
SERVERS=${SERVERS:-2}
WORKERS=${WORKERS:-2}
[[ $SERVERS =~ ^[0-9]+$ && $WORKERS =~ ^[0-9]+$ ]] || { echo "launch.sh: cannot read cluster.servers/workers from $SPEC" >&2; exit 2; }
if [[ -z $WORK ]]; then WORK=$(mktemp -d); fi
mkdir -p "$WORK"
TOKEN_PARAMETER="/paramserver/$NAME/cluster-token"

# User data for `role`, with the spec's scheduler address set to `scheduler`.
render_user_data() {
  local role=$1 port=$2 scheduler=$3
  local spec_b64
  spec_b64=$(sed -E "s|^(  scheduler:).*|\1 $scheduler|" "$SPEC" | base64 -w0)
  sed -e "s|@ROLE@|$role|g" -e "s|@PORT@|$port|g" -e "s|@RELEASE_URL@|$RELEASE_URL|g" \
    -e "s|@CLUSTER_YAML_B64@|$spec_b64|g" -e "s|@TOKEN_PARAMETER@|$TOKEN_PARAMETER|g" \
    -e "s|@REGION_ARG@|${REGION:+--region $REGION}|g" "$HERE/cloud-init.yaml.tmpl" > "$WORK/user-data-$role.yaml"
  echo "$WORK/user-data-$role.yaml"
}

common_args() {  # role, type, count
  local args=(ec2 run-instances --image-id "$AMI" --instance-type "$2" --count "$3" --subnet-id "$SUBNET"
              --security-group-ids "$GROUP" --iam-instance-profile "Name=$PROFILE"
              --metadata-options "HttpTokens=required,HttpEndpoint=enabled"
              --tag-specifications "ResourceType=instance,Tags=[{Key=Cluster,Value=$NAME},{Key=Role,Value=$1}]")
  [[ -z $KEY_NAME ]] || args+=(--key-name "$KEY_NAME")
  printf '%s\n' "${args[@]}"
}

# The cluster token: made here, kept only in SSM (encrypted) and on the instances. The
# value goes to the AWS CLI as a file, not on its command line (other local users see
# command lines); the file is removed once stored.
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$WORK/cluster.token")
aws_call "" ssm put-parameter --name "$TOKEN_PARAMETER" --type SecureString --overwrite \
  --value "file://$WORK/cluster.token" --output text >/dev/null
rm -f "$WORK/cluster.token"

GROUP=$(aws_call "sg-DRYRUN" ec2 create-security-group --group-name "ps-$NAME" \
  --description "paramserver cluster $NAME: its ports, open only to its members" --vpc-id "$VPC" \
  --query GroupId --output text)
aws_call "" ec2 authorize-security-group-ingress --group-id "$GROUP" \
  --ip-permissions "IpProtocol=tcp,FromPort=7000,ToPort=7002,UserIdGroupPairs=[{GroupId=$GROUP}]" \
  "IpProtocol=tcp,FromPort=9100,ToPort=9102,UserIdGroupPairs=[{GroupId=$GROUP}]" --output text >/dev/null

mapfile -t args < <(common_args scheduler "$SCHEDULER_TYPE" 1)
SCHEDULER_IP=$(aws_call "10.0.0.10" "${args[@]}" --user-data "file://$(render_user_data scheduler 7000 0.0.0.0:7000)" \
  --query "Instances[0].PrivateIpAddress" --output text)
mapfile -t args < <(common_args server "$SERVER_TYPE" "$SERVERS")
SERVER_IDS=$(aws_call "i-DRYRUN-S" "${args[@]}" --user-data "file://$(render_user_data server 7001 "$SCHEDULER_IP:7000")" \
  --query "Instances[].InstanceId" --output text)
mapfile -t args < <(common_args worker "$WORKER_TYPE" "$WORKERS")
((SPOT)) && args+=(--instance-market-options "MarketType=spot,SpotOptions={SpotInstanceType=one-time}")
WORKER_IDS=$(aws_call "i-DRYRUN-W" "${args[@]}" --user-data "file://$(render_user_data worker 7002 "$SCHEDULER_IP:7000")" \
  --query "Instances[].InstanceId" --output text)

cat <<SUMMARY
cluster $NAME started (user data in $WORK):
  security group  $GROUP (tcp 7000-7002 and 9100-9102 from its members only)
  scheduler       1 x $SCHEDULER_TYPE at $SCHEDULER_IP:7000
  servers         $SERVERS x $SERVER_TYPE: $SERVER_IDS
  workers         $WORKERS x $WORKER_TYPE$( ((SPOT)) && echo " (spot)"): $WORKER_IDS
cluster token  SSM SecureString $TOKEN_PARAMETER (psctl: --cluster-token-file with its value)
watch it:  psctl --cluster-token-file FILE --scheduler $SCHEDULER_IP:7000 status   (from inside the VPC)
stop it:   deploy/ec2/launch.sh down --name $NAME${REGION:+ --region $REGION}
SUMMARY
