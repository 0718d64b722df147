"""What SageMaker hands a training container, read and checked, and the job it describes:
the spec as `paramserver train` runs it and the daemons of each host. No process is
started here (deploy/container/sagemaker_train.py does that); every function takes the
folders it reads (`MlPaths`), so tests run it on folders of their own.
"""

import dataclasses
import json
import os
import re

import yaml


_ML_FOLDERS = {
    "resource_config": "input/config/resourceconfig.json",
    "hyperparameters": "input/config/hyperparameters.json",
    "config_channel": "input/data/config",
    "secrets_channel": "input/data/secrets",
    "model": "model",
    "checkpoints": "checkpoints",
    "output_data": "output/data",
    "tensorboard": "output/tensorboard",
    "failure": "output/failure",
}


@dataclasses.dataclass(frozen=True)
class MlPaths:
    """SageMaker's folders (the keys of _ML_FOLDERS), under `root` (/opt/ml in the container)."""

    root: str = "/opt/ml"

    def __getattr__(self, name):
        if name not in _ML_FOLDERS:
            raise AttributeError(name)
        return os.path.join(self.root, _ML_FOLDERS[name])


class BadInput(Exception):
    """What SageMaker or the user handed over is wrong; the message names it."""


HYPERPARAMETER_DEFAULTS = {
    "spec": "",
    "servers_per_host": "1",
    "workers_per_host": "1",
    "scheduler_port": "7070",
    "server_port": "7100",
    "worker_port": "8100",
}
# The numeric hyperparameters and their ranges.
HYPERPARAMETER_LIMITS = {
    "servers_per_host": (1, 64),
    "workers_per_host": (1, 64),
    "scheduler_port": (1, 65535),
    "server_port": (1, 65535),
    "worker_port": (1, 65535),
}
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def read_json(path, what):
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        raise BadInput(f"{path} is missing{': ' + what if what else ''}") from None
    except (OSError, ValueError) as error:
        raise BadInput(f"{path}: {error}") from None


def read_hosts(paths):
    """(this host, every host in SageMaker's order) from resourceconfig.json."""
    file = paths.resource_config
    config = read_json(file, "SageMaker writes it into every training container")
    if not isinstance(config, dict):
        raise BadInput(f"{file}: not a JSON object")
    hosts = config.get("hosts")
    current = config.get("current_host")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise BadInput(f"{file}: hosts must be a non-empty list of host names")
    for host in hosts:
        if not HOST_NAME.match(host):
            raise BadInput(f"{file}: {host!r} is not a host name")
    if len(set(hosts)) != len(hosts):
        raise BadInput(f"{file}: hosts names a host twice: {hosts}")
    if current not in hosts:
        raise BadInput(f"{file}: current_host {current!r} is not one of hosts {hosts}")
    return current, hosts


def unquote(key, value):
    """A hyperparameter's value as text: SageMaker's SDKs hand some JSON-encoded ("\\"1\\"")."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadInput(f"hyperparameter {key}: {value!r} is not a string")
    if isinstance(value, int):
        return str(value)
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    if isinstance(decoded, str) or (isinstance(decoded, int) and not isinstance(decoded, bool)):
        return str(decoded)
    return value


def read_hyperparameters(paths):
    """(the spec's path or "", the numeric settings) from hyperparameters.json, which may
    be absent (every default)."""
    given = {}
    if os.path.exists(paths.hyperparameters):
        given = read_json(paths.hyperparameters, "")
        if not isinstance(given, dict):
            raise BadInput(f"{paths.hyperparameters}: not a JSON object")
    settings = dict(HYPERPARAMETER_DEFAULTS)
    for key, value in given.items():
        if key.startswith("sagemaker_") or key.startswith("_"):
            continue  # SageMaker's own (an SDK's, a tuning job's)
        if key not in HYPERPARAMETER_DEFAULTS:
            raise BadInput(f"{paths.hyperparameters}: unknown hyperparameter {key!r} "
                           f"(known: {', '.join(sorted(HYPERPARAMETER_DEFAULTS))})")
        settings[key] = unquote(key, value)
    numbers = {}
    for key, (low, high) in HYPERPARAMETER_LIMITS.items():
        try:
            numbers[key] = int(settings[key])
        except ValueError:
            raise BadInput(f"hyperparameter {key}: {settings[key]!r} is not a whole number") from None
        if not low <= numbers[key] <= high:
            raise BadInput(f"hyperparameter {key}: {numbers[key]} is outside [{low}, {high}]")
    return settings["spec"], numbers


def find_spec(paths, spec):
    """The spec's path: the hyperparameter's, else the `config` channel's one YAML file."""
    if spec:
        if not os.path.isfile(spec):
            raise BadInput(f"hyperparameter spec: {spec} is not a file")
        return os.path.abspath(spec)
    try:
        names = sorted(n for n in os.listdir(paths.config_channel) if n.endswith((".yaml", ".yml")))
    except OSError:
        names = []
    if len(names) != 1:
        raise BadInput(f"no spec: give the hyperparameter spec, or a `config` channel with one .yaml "
                       f"file ({paths.config_channel} holds {len(names)})")
    return os.path.join(paths.config_channel, names[0])


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the job's daemons listen: the scheduler on the first host; server k of the
    job (host h's i-th: k = h * servers_per_host + i) on server_port + k, workers alike.
    The ports differ across hosts too, so that hosts sharing one network (a test's pod)
    never collide."""

    hosts: tuple
    servers_per_host: int
    workers_per_host: int
    scheduler_port: int
    server_port: int
    worker_port: int

    @classmethod
    def of(cls, hosts, numbers):
        layout = cls(tuple(hosts), numbers["servers_per_host"], numbers["workers_per_host"],
                     numbers["scheduler_port"], numbers["server_port"], numbers["worker_port"])
        ranges = {
            "scheduler_port": (layout.scheduler_port, layout.scheduler_port + 1),
            "server_port": (layout.server_port, layout.server_port + layout.servers),
            "worker_port": (layout.worker_port, layout.worker_port + layout.workers),
        }
        for key, (low, end) in ranges.items():
            if end - 1 > 65535:
                raise BadInput(f"hyperparameter {key}: ports {low}..{end - 1} run past 65535")
        names = sorted(ranges)
        for a_index, a in enumerate(names):
            for b in names[a_index + 1:]:
                (a_low, a_end), (b_low, b_end) = ranges[a], ranges[b]
                if a_low < b_end and b_low < a_end:
                    raise BadInput(f"hyperparameters {a} ({a_low}..{a_end - 1}) and {b} "
                                   f"({b_low}..{b_end - 1}) overlap")
        return layout

    @property
    def servers(self):
        return len(self.hosts) * self.servers_per_host

    @property
    def workers(self):
        return len(self.hosts) * self.workers_per_host

    @property
    def scheduler(self):
        return f"{self.hosts[0]}:{self.scheduler_port}"

    def server_ports(self, host):
        first = self.server_port + self.hosts.index(host) * self.servers_per_host
        return list(range(first, first + self.servers_per_host))

    def worker_ports(self, host):
        first = self.worker_port + self.hosts.index(host) * self.workers_per_host
        return list(range(first, first + self.workers_per_host))


class _TextDumper(yaml.SafeDumper):
    """Writes back the scalars yaml.BaseLoader read (all text) as they were written:
    plain where YAML allows (so `0.001`, `on`, `0755` or `1:30` reach the daemons' YAML
    parser as the same text, with whatever meaning it gives them), "" for the empty
    string."""


def _represent_text(dumper, value):
    if value == "":
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_scalar(dumper.resolve(yaml.ScalarNode, value, (True, False)), value)


_TextDumper.add_representer(str, _represent_text)

# The keys whose relative paths the daemons resolve against the spec's folder
# (common/config/cluster_spec.cc's ResolvePath), but for those train sets itself.
_DATA_FILE_KEYS = ("train_images", "train_labels", "test_images", "test_labels", "train", "test")


def _absolute(path, base_dir):
    if not isinstance(path, str) or path == "" or path.startswith(("/", "~/", "s3://")):
        return path
    return os.path.join(base_dir, path)


def _section(spec, name, source):
    value = spec.get(name)
    if value in (None, ""):
        value = spec[name] = {}
    if not isinstance(value, dict):
        raise BadInput(f"the spec {source}: {name} must be a mapping")
    return value


def holds_checkpoints(folder):
    try:
        return any(name.endswith(".ckpt") for name in os.listdir(folder))
    except OSError:
        return False


def effective_spec(paths, spec_path, layout, cluster_token, admin_token):
    """The spec as this job runs it (a dict of text, for write_spec): the cluster from
    LAYOUT, checkpoints, weights, report and TensorBoard in SageMaker's folders, resume
    when SageMaker put checkpoints back, the tokens TRAIN copied; relative paths made
    absolute against the spec's own folder."""
    try:
        with open(spec_path, encoding="utf-8") as file:
            spec = yaml.load(file, Loader=yaml.BaseLoader)  # every scalar as its text
    except (OSError, yaml.YAMLError) as error:
        raise BadInput(f"the spec {spec_path}: {error}") from None
    if not isinstance(spec, dict):
        raise BadInput(f"the spec {spec_path}: not a YAML mapping")
    base_dir = os.path.dirname(os.path.abspath(spec_path))

    cluster = _section(spec, "cluster", spec_path)
    cluster["scheduler"] = layout.scheduler
    cluster["servers"] = str(layout.servers)
    cluster["workers"] = str(layout.workers)
    checkpoint = _section(spec, "checkpoint", spec_path)
    checkpoint["dir"] = paths.checkpoints
    if holds_checkpoints(paths.checkpoints):
        checkpoint["resume"] = "true"
    output = _section(spec, "output", spec_path)
    output["weights"] = os.path.join(paths.model, "weights.safetensors")
    output["report"] = os.path.join(paths.output_data, "report.html")
    if output.get("tensorboard_dir"):
        output["tensorboard_dir"] = paths.tensorboard
    security = _section(spec, "security", spec_path)
    security["cluster_token_file"] = cluster_token
    if admin_token:
        security["admin_token_file"] = admin_token
    else:
        security["admin_token_file"] = _absolute(security.get("admin_token_file", ""), base_dir)
    tls = security.get("tls")
    if isinstance(tls, dict):
        for key in ("ca", "cert", "key"):
            if key in tls:
                tls[key] = _absolute(tls[key], base_dir)
    model = _section(spec, "model", spec_path)
    if "init_from" in model:
        model["init_from"] = _absolute(model["init_from"], base_dir)
    data = spec.get("data")
    if isinstance(data, dict) and model.get("type") != "torch":  # a torch script's data is its own
        for key in _DATA_FILE_KEYS:
            if isinstance(data.get(key), list):
                data[key] = [_absolute(path, base_dir) for path in data[key]]
            elif key in data:
                data[key] = _absolute(data[key], base_dir)
    return spec


def write_spec(spec, spec_path, spec_dir):
    """Writes SPEC as SPEC_DIR/cluster.yaml, beside links to every other file of the
    original's folder (a torch job's script runs there); returns its path."""
    os.makedirs(spec_dir, exist_ok=True)
    source_dir = os.path.dirname(os.path.abspath(spec_path))
    for name in os.listdir(source_dir):
        link = os.path.join(spec_dir, name)
        if name != "cluster.yaml" and not os.path.lexists(link):
            os.symlink(os.path.join(source_dir, name), link)
    path = os.path.join(spec_dir, "cluster.yaml")
    with open(path, "w", encoding="utf-8") as file:
        file.write(f"# {spec_path}, as `paramserver train` runs it on SageMaker\n")
        yaml.dump(spec, file, Dumper=_TextDumper, sort_keys=False)
    return path


def daemon_commands(layout, host, spec_file, state_file, bin_dir, gpus):
    """[(name, argv)] of HOST's daemons: the scheduler on the first host, then its servers
    and workers, each listening on all addresses and advertising HOST's name; worker i
    on gpu:i where HOST has a GPU for every worker (more than one worker)."""
    config = ["--config", spec_file]
    commands = []
    if host == layout.hosts[0]:
        commands.append(("scheduler", [f"{bin_dir}/ps_scheduler", *config, "--listen",
                                       f"0.0.0.0:{layout.scheduler_port}", "--state_file", state_file]))
    for i, port in enumerate(layout.server_ports(host)):
        commands.append((f"server-{i}", [f"{bin_dir}/ps_server", *config, "--listen", f"0.0.0.0:{port}",
                                         "--advertise", f"{host}:{port}"]))
    for i, port in enumerate(layout.worker_ports(host)):
        argv = [f"{bin_dir}/ps_worker", *config, "--listen", f"0.0.0.0:{port}", "--advertise", f"{host}:{port}"]
        if layout.workers_per_host > 1 and gpus >= layout.workers_per_host:
            argv += ["--device", f"gpu:{i}"]
        commands.append((f"worker-{i}", argv))
    return commands
