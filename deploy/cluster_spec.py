"""The cluster spec as the deployment tools read it (deploy/k8s/render.py, deploy/ec2/launch.py).

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
        value = spec["cluster"].get(key, 2)  # unset: the daemons' default (common/config/cluster_spec.h)
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
    spec["_nodes"] = yaml.compose(text)
    return spec


def servers(spec):
    """The servers the job starts with: cluster.servers, or its range's min."""
    return spec["_servers"][0]


def workers(spec):
    """The workers the job starts with: cluster.workers, or its range's min."""
    return spec["_workers"][0]


def max_workers(spec):
    """The most workers the job takes: cluster.workers, or its range's max."""
    return spec["_workers"][1]


def scheduler(spec):
    """cluster.scheduler as written (None when unset)."""
    value = spec["cluster"].get("scheduler")
    return None if value is None else str(value)


def checkpoint_dir(spec):
    """checkpoint.dir as written ("" when unset)."""
    return str((spec.get("checkpoint") or {}).get("dir") or "")


# Keys whose s3:// value is written (the rest are read): checkpoint.dir is a prefix whose
# objects are written, listed and pruned; output.weights and output.report are objects.
_WRITTEN_KEYS = ("dir", "weights", "report")


def s3_prefixes(spec):
    """The s3:// prefixes the spec names, as sorted unique (mode, bucket, prefix) with mode
    "read" or "write": the folder of a data file or model.init_from (read), of
    output.weights or output.report (write), and checkpoint.dir itself (write)."""
    found = set()

    def visit(key, value):
        if isinstance(value, dict):
            for k, item in value.items():
                visit(str(k), item)
        elif isinstance(value, list):
            for item in value:
                visit(key, item)
        elif isinstance(value, str) and value.startswith("s3://"):
            bucket, _, path = value[len("s3://"):].partition("/")
            if key != "dir":
                path = path.rpartition("/")[0]
            found.add(("write" if key in _WRITTEN_KEYS else "read", bucket, path.rstrip("/")))

    visit("", {k: v for k, v in spec.items() if not k.startswith("_")})
    return sorted(found)


def relative_output_paths(spec):
    """(key, path) of every output path that is relative (not /..., not s3://): on a
    machine whose daemons run under a unit, these resolve somewhere unwritable."""
    found = []

    def visit(value):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("weights", "report", "dir", "tensorboard_dir") and isinstance(item, str):
                    if item and not item.startswith(("/", "s3://")):
                        found.append((key, item))
                else:
                    visit(item)

    visit({k: v for k, v in spec.items() if not k.startswith("_")})
    return found


def _mapping_value(node, key):
    """In a composed YAML mapping node: (key node, value node) of `key` (the last, as the
    loader keeps it), or None."""
    found = None
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                found = key_node, value_node
    return found


def _written_in_place(spec, parent, key, kind):
    """(key node, value node) of `key` in the mapping node `parent`, written there as a
    `kind` node (not through a merge key `<<` or an alias, whose text lies elsewhere and
    may be shared, nor an anchored value, which an alias may repeat); else SpecError."""
    name = f"{parent[0]}.{key}" if parent[0] else key
    found = _mapping_value(parent[1], key)
    if (found is None or not isinstance(found[1], kind) or found[1].start_mark.index < found[0].end_mark.index
            or (kind is yaml.ScalarNode and spec["_text"][found[1].start_mark.index] == "&")):
        how = "a value" if kind is yaml.ScalarNode else "a section"
        raise SpecError(f"{spec['_path']}: {name} must be written as {how} in place (not through a YAML merge "
                        "key '<<', an alias '*' or with an anchor '&'): the launcher rewrites its text for the "
                        "instances")
    return found


def rendered_text(spec, scheduler_address, resume=False):
    """The spec's text with cluster.scheduler replaced by `scheduler_address` and, with
    `resume`, checkpoint.resume set to true; every other byte as written (comments, style,
    block or flow). SpecError when cluster.scheduler (with `resume`: the checkpoint
    section and its resume key) is not written in place, so that its text can be edited."""
    text = spec["_text"]
    edits = []  # (start, end, replacement), applied from the end
    _, cluster = _written_in_place(spec, ("", spec["_nodes"]), "cluster", yaml.MappingNode)
    _, address = _written_in_place(spec, ("cluster", cluster), "scheduler", yaml.ScalarNode)
    edits.append((address.start_mark.index, address.end_mark.index, scheduler_address))
    if resume:
        _, checkpoint = _written_in_place(spec, ("", spec["_nodes"]), "checkpoint", yaml.MappingNode)
        if not checkpoint.value:
            raise SpecError(f"{spec['_path']}: checkpoint has no keys (--resume needs its dir)")
        if _mapping_value(checkpoint, "resume"):
            _, existing = _written_in_place(spec, ("checkpoint", checkpoint), "resume", yaml.ScalarNode)
            edits.append((existing.start_mark.index, existing.end_mark.index, "true"))
        else:
            first_key = checkpoint.value[0][0]
            at = first_key.start_mark.index
            separator = ", " if checkpoint.flow_style else "\n" + " " * first_key.start_mark.column
            edits.append((at, at, "resume: true" + separator))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


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
