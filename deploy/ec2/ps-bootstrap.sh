#!/usr/bin/env bash
# Boots one paramserver instance: run once by cloud-init (deploy/ec2/cloud-init.yaml.tmpl
# writes it to /usr/local/sbin/ps-bootstrap, with /etc/ps/bootstrap.env and
# /etc/ps/cluster.yaml beside it). In order:
#   1. Debian's runtime libraries and the AWS CLI (apt-get);
#   2. on a GPU worker: NVIDIA's Debian 12 repository, the driver (580 or newer: CUDA 13
#      needs it), the CUDA 13 runtime and cuBLAS, checked with nvidia-smi;
#   3. the release (RELEASE_URL) into /opt/paramserver, with its systemd units;
#   4. the secrets, read from SSM Parameter Store with the instance role into /etc/ps
#      (root:ps, 0640): the cluster token, the admin token (scheduler), the TLS files;
#   5. the CloudWatch agent: this node's journal and its Prometheus metrics;
#   6. the role's unit, started with the flags this node needs (/etc/ps/node.env).
# Every step logs to /var/log/ps-bootstrap.log; a failed step stops the boot there and
# says which. Tested by tests/commands/cloud_init_test.sh, in a throwaway root and
# network namespace with stand-ins for apt-get, systemctl, curl and aws.
set -euo pipefail
# shellcheck source=/dev/null
source /etc/ps/bootstrap.env  # CLUSTER ROLE REGION RELEASE_URL PARAMETERS GPU TLS LOG_GROUP METRICS_PORT
exec > >(tee -a /var/log/ps-bootstrap.log) 2>&1
step() { echo "ps-bootstrap [$ROLE]: $*"; }
export DEBIAN_FRONTEND=noninteractive AWS_DEFAULT_REGION=$REGION
tmp=${TMPDIR:-/tmp}

step "1/6 Debian's runtime libraries and the AWS CLI"
apt-get update
# What the binaries link (ldd, mapped to Debian 12's packages; their dependencies follow).
apt-get install -y --no-install-recommends libabsl20220623 libcpp-httplib0.11 libgrpc++1.51 \
  libopenblas0-pthread libprometheus-cpp-core1.0 libprotobuf32 libspdlog1.10 libssl3 \
  libtcmalloc-minimal4 libyaml-cpp0.7 awscli curl ca-certificates dataset-fashion-mnist

if [[ $ROLE == worker ]]; then
  # ps_worker links libcudart.so.13 and libcublas.so.13 whatever the instance, so every
  # worker gets the runtime; a GPU instance also gets the driver (CUDA 13 needs 580 or
  # newer, which Debian 12's own nvidia-driver is not). Both from NVIDIA's repository.
  step "2/6 the CUDA 13 runtime and cuBLAS$( ((GPU)) && echo ", and the NVIDIA driver") (NVIDIA's Debian 12 repository)"
  curl -fsSL https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
    -o "$tmp/cuda-keyring.deb"
  dpkg -i "$tmp/cuda-keyring.deb"
  apt-get update
  apt-get install -y --no-install-recommends cuda-cudart-13-0 libcublas-13-0
  echo /usr/local/cuda-13.0/targets/x86_64-linux/lib >/etc/ld.so.conf.d/paramserver-cuda.conf
  ldconfig
  if [[ $GPU == 1 ]]; then
    # The open kernel modules (NVIDIA's choice for Turing and newer, every GPU the worker
    # is built for), built by DKMS against this kernel.
    apt-get install -y --no-install-recommends "linux-headers-$(uname -r)" dkms
    apt-get install -y --no-install-recommends nvidia-open
    modprobe nvidia
    nvidia-smi -L || step "nvidia-smi sees no GPU: the worker will say why and compute on the CPU"
  fi
else
  step "2/6 the $ROLE needs no CUDA library"
fi

step "3/6 the release from $RELEASE_URL"
curl -fsSL "$RELEASE_URL" -o "$tmp/paramserver.tar.gz"
mkdir -p "$tmp/paramserver"
tar -xzf "$tmp/paramserver.tar.gz" -C "$tmp/paramserver" --strip-components=1
"$tmp/paramserver/install.sh" --prefix /opt/paramserver --systemd

step "4/6 the secrets from SSM Parameter Store ($PARAMETERS/*)"
# read_secret NAME FILE: the SecureString NAME into FILE, readable by root and ps only;
# the value never passes through a command line or the user data.
read_secret() {
  (umask 077 && aws ssm get-parameter --with-decryption --name "$PARAMETERS/$1" \
    --query Parameter.Value --output text >"$2.new")
  [[ -s "$2.new" ]] || { step "the parameter $PARAMETERS/$1 is empty"; exit 1; }
  chown root:ps "$2.new"
  chmod 0640 "$2.new"
  mv "$2.new" "$2"
}
read_secret cluster-token /etc/ps/cluster.token
flags="--cluster_token_file /etc/ps/cluster.token"
if [[ $ROLE == scheduler ]]; then
  read_secret admin-token /etc/ps/admin.token
  flags+=" --admin_token_file /etc/ps/admin.token"
fi
if [[ $TLS == 1 ]]; then
  install -d -m 0750 -o root -g ps /etc/ps/tls
  read_secret tls-ca /etc/ps/tls/ca.pem
  read_secret tls-cert /etc/ps/tls/node.pem
  read_secret tls-key /etc/ps/tls/node.key
  flags+=" --tls_dir /etc/ps/tls"
fi
# The unit's extra flags, and the region for the AWS CLI the daemons run (s3:// paths).
cat >/etc/ps/node.env <<ENV
PS_FLAGS=$flags
AWS_DEFAULT_REGION=$REGION
ENV

step "5/6 the CloudWatch agent: the journal of ps-$ROLE into $LOG_GROUP, its metrics"
install -d -m 0755 /var/log/ps /opt/aws/amazon-cloudwatch-agent/etc
curl -fsSL "https://amazoncloudwatch-agent-$REGION.s3.$REGION.amazonaws.com/debian/amd64/latest/amazon-cloudwatch-agent.deb" \
  -o "$tmp/amazon-cloudwatch-agent.deb"
dpkg -i "$tmp/amazon-cloudwatch-agent.deb"
cat >/opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml <<PROMETHEUS
global:
  scrape_interval: 30s
  scrape_timeout: 10s
scrape_configs:
  - job_name: paramserver
    static_configs:
      - targets: ["127.0.0.1:$METRICS_PORT"]
        labels: {role: $ROLE, cluster: $CLUSTER}
PROMETHEUS
gpu_metrics=""
[[ $GPU == 1 ]] && gpu_metrics=', "nvidia_gpu": {"measurement": ["utilization_gpu", "memory_used", "temperature_gpu"]}'
cat >/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json <<AGENT
{
  "agent": {"region": "$REGION", "run_as_user": "root"},
  "metrics": {
    "namespace": "paramserver/host",
    "append_dimensions": {"InstanceId": "\${aws:InstanceId}"},
    "metrics_collected": {
      "mem": {"measurement": ["mem_used_percent"]},
      "disk": {"measurement": ["used_percent"], "resources": ["/"]}$gpu_metrics
    }
  },
  "logs": {
    "logs_collected": {
      "files": {
        "collect_list": [
          {"file_path": "/var/log/ps/journal.log", "log_group_name": "$LOG_GROUP",
           "log_stream_name": "{instance_id}-$ROLE", "timestamp_format": "%Y-%m-%dT%H:%M:%S"},
          {"file_path": "/var/log/ps-bootstrap.log", "log_group_name": "$LOG_GROUP",
           "log_stream_name": "{instance_id}-$ROLE-bootstrap"}
        ]
      }
    },
    "metrics_collected": {
      "prometheus": {
        "cluster_name": "$CLUSTER",
        "log_group_name": "$LOG_GROUP/prometheus",
        "prometheus_config_path": "/opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml",
        "emf_processor": {
          "metric_declaration_dedup": true,
          "metric_namespace": "paramserver",
          "metric_declaration": [
            {"source_labels": ["job"], "label_matcher": "^paramserver$",
             "dimensions": [["cluster", "role"]],
             "metric_selectors": ["^worker_step$", "^worker_loss$", "^worker_samples_per_second$",
                                  "^worker_test_accuracy$", "^scheduler_total_steps$",
                                  "^scheduler_eta_seconds$", "^scheduler_test_accuracy$",
                                  "^scheduler_map_version$", "^ps_shard_applied_updates_total$",
                                  "^ps_checkpoint_failed_writes$",
                                  "^scheduler_checkpoint_failed_writes$"]},
            {"source_labels": ["job"], "label_matcher": "^paramserver$",
             "dimensions": [["cluster", "node", "health"]],
             "metric_selectors": ["^scheduler_node_health$"]}
          ]
        }
      }
    }
  }
}
AGENT
systemctl enable --now ps-journal-export.service
amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s \
  -c file:/opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json

step "6/6 ps-$ROLE.service"
systemctl enable --now "ps-$ROLE.service"
step "done: ps-$ROLE.service started; its journal goes to $LOG_GROUP"
