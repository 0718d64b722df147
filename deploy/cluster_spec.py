"""The cluster spec as the deployment tools read it (deploy/k8s/render.py).

A YAML parser (PyYAML, Debian's python3-yaml) reads the spec whole, block or flow style
alike; the daemons' own reader (common/config/cluster_spec.cc) stays the authority on
what a spec means (`ps_scheduler --config SPEC --describe` checks one). This module reads
only what deploying needs, with a clear error naming the key for anything it cannot use.
"""
import os
import re

import yaml


class SpecError(Exception):
    """A spec the deployment cannot use; the message names the file and the key."""


def load(path):
    """The spec at `path` as a dict, with the keys deploying reads checked."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec ({e.strerror})") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not YAML: {e}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict):
        raise SpecError(f"{path}: no cluster section (cluster: {{servers: N, workers: N, ...}})")
    for key in ("servers", "workers"):
        value = spec["cluster"].get(key)
        if isinstance(value, dict) and set(value) <= {"min", "max"} and "min" in value:
            low, high = value["min"], value.get("max", value["min"])
        else:
            low = high = value
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (low, high)) or high < low:
            raise SpecError(f"{path}: cluster.{key} must be a whole number of at least 1, or "
                            f"{{min: N, max: M}} with 1 <= N <= M, found {value!r}")
        spec["_" + key] = (low, high)
    spec["_path"] = os.path.abspath(path)
    spec["_text"] = text
    return spec


def servers(spec):
    """The servers the job starts with: cluster.servers, or its range's min."""
    return spec["_servers"][0]


def workers(spec):
    """The workers the job starts with: cluster.workers, or its range's min."""
    return spec["_workers"][0]




def replication(spec):
    """cluster.replication, or the daemons' default: 2 with at least 2 servers, else 1."""
    value = spec["cluster"].get("replication")
    if value is None or value == 0:
        return 2 if servers(spec) >= 2 else 1
    if not isinstance(value, int) or value < 1 or value > servers(spec):
        raise SpecError(f"{spec['_path']}: cluster.replication must be 1 to cluster.servers, found {value!r}")
    return value




def worker_device(spec):
    return str((spec.get("worker") or {}).get("device", "auto"))


def command_files(spec):
    """The files a torch job's worker.command names beside the spec (train.py): relative
    paths that exist in the spec's folder, as (name, absolute path)."""
    files = []
    folder = os.path.dirname(spec["_path"])
    for word in (spec.get("worker") or {}).get("command") or []:
        word = str(word)
        if os.path.isabs(word) or not re.fullmatch(r"[A-Za-z0-9._-]+", word):
            continue
        path = os.path.join(folder, word)
        if os.path.isfile(path):
            files.append((word, path))
    return files


def local_paths(spec):
    """Paths the daemons would read or write on their own disk (not s3://), as
    (key, path): in a container they must be inside the image or on a volume."""
    found = []

    def visit(prefix, value):
        if isinstance(value, dict):
            for key, item in value.items():
                visit(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, list):
            for item in value:
                visit(prefix, item)
        elif isinstance(value, str) and value.startswith(("/", "~", "./")) and not prefix.startswith("worker.command"):
            found.append((prefix, value))

    for section in ("data", "output", "checkpoint", "model"):
        visit(section, spec.get(section))
    return found
