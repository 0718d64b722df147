#!/usr/bin/env python3
"""Runs every benchmark, interleaved and repeated, and prints the table of ratios.
Called by bench/run.sh after it installed and built what this needs; see that script
for the options, and docs/PERFORMANCE.md for how to read the table."""
import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

REFERENCE_PARAMETERS = 784 * 128 + 128 + 128 * 10 + 10  # the 784-128-10 MLP
BATCH = 32
WIDE_LAYERS = "[784, 2048, 2048, 10]"  # 5.8M parameters, for the push-bucket rows


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(command, timeout, env=None):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}"
                           f"\n{result.stderr[-3000:]}")
    return result.stdout


def key_values(text):
    return {k: float(v) for k, v in re.findall(r"([a-z_/][a-z0-9_/]*)=([0-9.]+)", text)}


def table_arguments():
    """The options of a benchmark that bench/run.sh runs after this one: --root, --repeats
    and --quick (1 repeat); the others are this script's."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args, _ = parser.parse_known_args()
    if args.quick:
        args.repeats = 1
    return args


def print_table(rows):
    """Prints (what, ours, reference, ratio, goal) rows under a header, in columns."""
    header = ("what", "ours", "reference", "ratio", "goal")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    for r in [header] + rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())


def transport(root, parameters, wire_dtype="float32", cluster_token=True, rounds=5):
    out = run([f"{root}/bazel-bin/bench/transport_bench", f"--parameters={parameters}", "--shards=4",
               "--servers=2", f"--rounds={rounds}", f"--wire_dtype={wire_dtype}",
               f"--cluster_token={str(cluster_token).lower()}"], timeout=900)
    return key_values(out)


def round_trip(root, parameters):
    """A loopback round trip moving `parameters` float32 each way (transport_bench, one
    server, one shard): over raw TCP and through our push whose reply carries the pull,
    in ms."""
    out = key_values(run([f"{root}/bazel-bin/bench/transport_bench", f"--parameters={parameters}", "--shards=1",
                          "--servers=1", "--rounds=50"], timeout=300))
    round_bytes = 2 * 4 * parameters
    return {"raw_round_trip_ms": round_bytes / (out["raw_tcp_gbps"] * 1e9) * 1e3,
            "ours_round_trip_ms": round_bytes / (out["fused_gbps"] * 1e9) * 1e3}


def control_plane(root, sizes):
    """The scheduler's registry at each cluster size (control_plane_bench): {nodes: figures}."""
    out = run([f"{root}/bazel-bin/bench/control_plane_bench", "--nodes=" + ",".join(map(str, sizes)), "--rounds=5"],
              timeout=600)
    figures = {}
    for line in out.splitlines():
        if line.startswith("control_plane "):
            values = key_values(line)
            figures[str(int(values["nodes"]))] = values
    return figures


def scheduler_scale(root, servers, workers, seconds=10):
    """A real ps_scheduler with `servers` + `workers` simulated nodes (bench/simulated_nodes.cc):
    heartbeat latency, the scheduler's CPU and memory, and how fast a server's loss reaches
    every node."""
    with tempfile.TemporaryDirectory(prefix="ps-scale.") as d:
        token_file = f"{d}/cluster.token"
        with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        with open(f"{root}/deploy/local/fashion_mnist.yaml") as f:
            config = f.read()
        for key, value in (("servers", servers), ("workers", workers), ("shards", 16 * servers),
                           ("mode", "async")):
            config, count = re.subn(rf"^(\s+{key}:)\s*\S+", rf"\g<1> {value}", config, count=1, flags=re.M)
            assert count == 1, key
        with open(f"{d}/job.yaml", "w") as f:
            f.write(config)
        port_file = f"{d}/scheduler.port"
        with open(f"{d}/scheduler.log", "w") as log_file:
            scheduler = subprocess.Popen(
                [f"{root}/bazel-bin/scheduler/ps_scheduler", "--config", f"{d}/job.yaml", "--listen",
                 "127.0.0.1:0", "--port_file", port_file, "--cluster_token_file", token_file],
                stdout=log_file, stderr=subprocess.STDOUT)
        try:
            give_up = time.time() + 30
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                if time.time() > give_up or scheduler.poll() is not None:
                    raise RuntimeError(f"the scheduler did not start: {open(f'{d}/scheduler.log').read()[-2000:]}")
                time.sleep(0.05)
            port = open(port_file).read().strip()
            try:
                out = run([f"{root}/bazel-bin/bench/simulated_nodes", f"--scheduler=127.0.0.1:{port}",
                           f"--scheduler_pid={scheduler.pid}", f"--cluster_token_file={token_file}",
                           f"--servers={servers}", f"--workers={workers}", f"--seconds={seconds}"], timeout=900)
            except RuntimeError as failed:
                raise RuntimeError(f"{failed}\nthe scheduler's log ends:\n{open(f'{d}/scheduler.log').read()[-3000:]}")
        finally:
            scheduler.kill()
            scheduler.wait()
    return key_values(next(line for line in out.splitlines() if line.startswith("simulated ")))


def dense_optimizers(root, parameters):
    """Each dense optimizer's rate and its own memory bound (bench/dense_optimizer_bench)."""
    out = run([f"{root}/bazel-bin/bench/dense_optimizer_bench", str(parameters), "7"], timeout=900)
    found = {}
    for name, updates, bound, size in re.findall(
            r"^(\w+)\s+([0-9.]+) M updates/s  the bound:\s+([0-9.]+) M updates/s at\s+(\d+) B",
            out, re.M):
        found[name] = {"m_updates_per_sec": float(updates), "bound_m_updates_per_sec": float(bound),
                       "bytes_per_parameter": int(size)}
    a = found["adam"]
    found["adam_m_updates_per_sec"] = a["m_updates_per_sec"]
    found["bound_m_updates_per_sec"] = a["bound_m_updates_per_sec"]
    return found


EMBEDDING_OPTIMIZERS = ("adam", "adagrad", "rowwise_adagrad", "ftrl", "sgd")


def embedding(root, rows):
    """Each row optimizer's pull and update rates and their own memory bound, at `rows` rows of dim 16."""
    out = run([f"{root}/bazel-bin/bench/embedding_table_bench", str(rows), "16", "3", "all"], timeout=900)
    found = {}
    for name, bytes_per_row, minimum in re.findall(
            r"^optimizer (\w+) rows \d+ dim \d+ bytes_per_row ([0-9.]+) minimum_bytes_per_row (\d+)", out, re.M):
        found[name] = {"bytes_per_row": float(bytes_per_row), "minimum_bytes_per_row": float(minimum)}
    for name, pull, pull_bound, apply, apply_bound in re.findall(
            r"^(\w+) pull ([0-9.]+) M rows/s bound ([0-9.]+) M rows/s apply ([0-9.]+) M rows/s bound ([0-9.]+) M rows/s",
            out, re.M):
        found[name].update({"pull_m_rows_per_sec": float(pull), "pull_bound_m_rows_per_sec": float(pull_bound),
                            "apply_m_rows_per_sec": float(apply), "apply_bound_m_rows_per_sec": float(apply_bound)})
    for name, check in re.findall(r"^(\w+) pull .* check ([0-9.]+) M rows/s", out, re.M):
        found[name]["check_m_rows_per_sec"] = float(check)
    return found


def shard_copy(root, rows):
    """A new backup's copy of an embedding shard of `rows` rows (dim 8, Adagrad) from its primary over gRPC on
    127.0.0.1 (shard_copy_bench), and a worker's export of its table, each against raw TCP
    moving the same bytes one way: seconds."""
    return key_values(run([f"{root}/bazel-bin/bench/shard_copy_bench", f"--rows={rows}", "--rounds=3"], timeout=900))


def embedding_server(root, sizes):
    """Two gRPC servers' embedding shards (one table, dim 8, row-wise Adagrad) filled to each of `sizes` rows
    and trained by one client (embedding_server_bench), against the shards' own work in process: figures by
    size."""
    out = run([f"{root}/bazel-bin/bench/embedding_server_bench", "--rows=" + ",".join(str(s) for s in sizes),
               "--rounds=3"], timeout=900)
    return {str(int(f["rows"])): f for f in (key_values(line) for line in out.splitlines() if line.startswith("rows="))}


def recovery(root, kills):
    """kill -9 of a primary server, `kills` times: detection and resumption (bench/recovery_bench.py)."""
    out = run(["/usr/bin/python3", f"{root}/bench/recovery_bench.py", "--root", root, "--kills", str(kills)],
              timeout=120 + 30 * kills)
    return key_values([line for line in out.splitlines() if line.startswith("recovery ")][-1])


def ours(root, workdir, mode, size, epochs, tag, wire_dtype="float32", overlap=False, layers=None, max_steps=0,
         push_bucket_kb=1024, replication=None):
    with open(f"{root}/deploy/local/fashion_mnist.yaml") as f:
        config = f.read()
    for key, value in (("servers", size), ("workers", size), ("mode", mode), ("epochs", epochs),
                       ("max_steps", max_steps), ("layers", layers or "[784, 128, 10]")):
        config, count = re.subn(rf"^(\s+{key}:)\s*(\[[^]]*\]|\S+)", rf"\g<1> {value}", config, count=1, flags=re.M)
        assert count == 1, key
    config = re.sub(r"^training:\n", f"training:\n  wire_dtype: {wire_dtype}\n  overlap: {str(overlap).lower()}\n"
                    f"  push_bucket_kb: {push_bucket_kb}\n", config, count=1, flags=re.M)
    if replication is not None:  # else the default: 2 copies of every shard once there are 2 servers
        config = re.sub(r"^cluster:\n", f"cluster:\n  replication: {replication}\n", config, count=1, flags=re.M)
    path = f"{workdir}/{tag}.yaml"
    with open(path, "w") as f:
        f.write(config)
    run_dir = f"{workdir}/{tag}-run"
    out = run([f"{root}/deploy/local/run.sh", path], timeout=1800, env={"PS_RUN_DIR": run_dir})
    figures = key_values(out.strip().splitlines()[-1])
    with open(f"{run_dir}/worker-0.log") as f:
        profile = re.search(r"step_profile (.*) \(mean per step\)", f.read())
    if profile:
        figures.update({"step_" + k: v for k, v in key_values(profile.group(1)).items()})
    subprocess.run(["rm", "-rf", run_dir])
    return figures


def peer(root, kind, workers, epochs, max_steps=0):
    out = run(["/usr/bin/python3", f"{root}/bench/pytorch_peers.py", "--peer", kind, "--workers", str(workers),
               "--epochs", str(epochs), "--max-steps", str(max_steps)], timeout=1800)
    return key_values([line for line in out.splitlines() if line.startswith("peer=")][-1])


def median_of(samples, key):
    """The median of each repeat's figure `key`; of each of its figures, where it is a dict of them."""
    values = [s[key] for s in samples if key in s]
    if values and isinstance(values[0], dict):
        return {k: median_of(values, k) for k in values[0]}
    return statistics.median(values) if values else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    transport_parameters = (4 << 20) if args.quick else (64 << 20)
    adam_parameters = (4 << 20) if args.quick else (16 << 20)
    embedding_sizes = (200000,) if args.quick else (1000000, 10000000)
    control_plane_sizes = (100, 200) if args.quick else (100, 500, 2000)
    # Past one message's 512 MiB at full size: the copy is streamed in pieces.
    shard_copy_rows = 200000 if args.quick else 10000000
    server_rows = (200000,) if args.quick else (1000000, 10000000)
    # (servers, workers) of the real scheduler's runs with simulated nodes.
    scheduler_sizes = ((12, 88),) if args.quick else ((12, 88), (62, 438), (256, 1744))
    wide_steps = 10 if args.quick else 150
    # A smoke run's end-to-end jobs stop early: each part runs, none for its figures.
    e2e_steps = 300 if args.quick else 0

    results = {}  # name -> list of figure dicts, one per repeat

    def record(name, function, *function_args):
        log(f"{name} ...")
        results.setdefault(name, []).append(function(*function_args))

    ours_configs = [(mode, size) for size in (1, 2) for mode in ("sync", "async")]
    with tempfile.TemporaryDirectory(prefix="ps-bench.") as workdir:
        for repeat in range(args.repeats):
            log(f"repeat {repeat + 1} of {args.repeats}")
            record("transport", transport, args.root, transport_parameters)
            record("transport-bfloat16", transport, args.root, transport_parameters, "bfloat16")
            # The cluster token's cost: checked on every call (large and small ones).
            record("transport-no-token", transport, args.root, transport_parameters, "float32", False)
            record("transport-small", transport, args.root, 64 << 10, "float32", True, 200)
            record("transport-small-no-token", transport, args.root, 64 << 10, "float32", False, 200)
            # What a server replicates per step in the 2x2 jobs: its half of the model.
            record("round-trip", round_trip, args.root, REFERENCE_PARAMETERS // 2)
            record("adam", dense_optimizers, args.root, adam_parameters)
            for table_rows in embedding_sizes:
                record(f"embedding-{table_rows}", embedding, args.root, table_rows)
            record("shard-copy", shard_copy, args.root, shard_copy_rows)
            record("embedding-server", embedding_server, args.root, server_rows)
            record("recovery", recovery, args.root, 2 if args.quick else 7)
            record("control-plane", control_plane, args.root, control_plane_sizes)
            for servers, workers in scheduler_sizes:
                record(f"scheduler-{servers + workers}", scheduler_scale, args.root, servers, workers,
                       3 if args.quick else 10)
            for mode, size in ours_configs:
                record(f"ours-{mode}-{size}", ours, args.root, workdir, mode, size, args.epochs, f"{mode}-{size}",
                       "float32", False, None, e2e_steps)
            record("ours-async-1-overlap", ours, args.root, workdir, "async", 1, args.epochs, "async-1-overlap",
                   "float32", True, None, e2e_steps)
            for mode in ("sync", "async"):  # no backups, like the peers
                record(f"ours-{mode}-2-r1", ours, args.root, workdir, mode, 2, args.epochs, f"{mode}-2-r1", "float32",
                       False, None, e2e_steps, 1024, 1)
            for kb in (1024, 0):
                record(f"wide-sync-1-bucket{kb}", ours, args.root, workdir, "sync", 1, 1, f"wide-bucket{kb}", "float32",
                       False, WIDE_LAYERS, wide_steps, kb)
            for dtype in ("bfloat16", "float16"):
                record(f"ours-sync-2-{dtype}", ours, args.root, workdir, "sync", 2, args.epochs, f"sync-2-{dtype}", dtype,
                       False, None, e2e_steps)
            record("single", peer, args.root, "single", 1, args.epochs, e2e_steps)
            for size in (1, 2):
                record(f"ddp-{size}", peer, args.root, "ddp", size, args.epochs, e2e_steps)
                record(f"rpc-{size}", peer, args.root, "rpc", size, args.epochs, e2e_steps)

    m = {name: {key: median_of(samples, key) for key in samples[0]} for name, samples in results.items()}
    rows = []

    def row(what, ours_text, reference_text, ratio, goal):
        rows.append((what, ours_text, reference_text, f"{ratio:.2f}", goal))

    t = m["transport"]
    gb = transport_parameters * 4 / 1e9
    row(f"1 transport: push+pull {transport_parameters >> 20}M fp32, 4 shards on 2 servers, 1 worker",
        f"{t['transport_gbps']:.2f} GB/s", f"raw TCP loopback {t['raw_tcp_gbps']:.2f} GB/s",
        t["transport_gbps"] / t["raw_tcp_gbps"], ">= 0.7")
    row("  the same in one round trip (push whose reply carries the next pull)",
        f"{t['fused_gbps']:.2f} GB/s", f"raw TCP loopback {t['raw_tcp_gbps']:.2f} GB/s",
        t["fused_gbps"] / t["raw_tcp_gbps"], "")
    row("  with the servers applying Adam to every push", f"{t['with_adam_gbps']:.2f} GB/s",
        f"raw TCP loopback {t['raw_tcp_gbps']:.2f} GB/s", t["with_adam_gbps"] / t["raw_tcp_gbps"], "")
    tb = m["transport-bfloat16"]
    row("  the same with bfloat16 on the wire (GB/s of float32 tensor bytes)", f"{tb['transport_gbps']:.2f} GB/s",
        f"float32 on the wire {t['transport_gbps']:.2f} GB/s", tb["transport_gbps"] / t["transport_gbps"], "")
    nt = m["transport-no-token"]
    row("  the same without the cluster token (every job has one: its checks' cost)",
        f"{t['transport_gbps']:.2f} GB/s", f"no token {nt['transport_gbps']:.2f} GB/s",
        t["transport_gbps"] / nt["transport_gbps"], "~1 (noise)")
    ts, tsn = m["transport-small"], m["transport-small-no-token"]
    row("  64K fp32 (call costs dominate), with the token against without", f"{ts['transport_gbps']:.3f} GB/s",
        f"no token {tsn['transport_gbps']:.3f} GB/s", ts["transport_gbps"] / tsn["transport_gbps"], "~1 (noise)")
    a = m["adam"]
    row(f"2 server Adam, {adam_parameters >> 20}M parameters", f"{a['adam_m_updates_per_sec']:.0f} M updates/s",
        f"memory bound {a['bound_m_updates_per_sec']:.0f} M updates/s (28 B each)",
        a["adam_m_updates_per_sec"] / a["bound_m_updates_per_sec"], ">= 0.8")
    for name, o in a.items():
        if not isinstance(o, dict) or name == "adam":
            continue
        row(f"  {name}", f"{o['m_updates_per_sec']:.0f} M updates/s",
            f"memory bound {o['bound_m_updates_per_sec']:.0f} M updates/s ({o['bytes_per_parameter']} B each)",
            o["m_updates_per_sec"] / o["bound_m_updates_per_sec"], ">= 0.8")
    for table_rows in embedding_sizes:
        size = f"{table_rows / 1e6:g}M rows of dim 16"
        e = m[f"embedding-{table_rows}"]
        for name in EMBEDDING_OPTIMIZERS:
            o = e[name]
            row(f"2 embedding table, {size}, {name}: bytes per row vs the minimum", f"{o['bytes_per_row']:.0f} B/row",
                f"minimum {o['minimum_bytes_per_row']:.0f} B (row + state)",
                o["minimum_bytes_per_row"] / o["bytes_per_row"], "<= 1.3x: >= 0.77")
            row(f"  {name} row updates vs the same traffic without arithmetic",
                f"{o['apply_m_rows_per_sec']:.1f} M rows/s", f"bound {o['apply_bound_m_rows_per_sec']:.1f} M rows/s",
                o["apply_m_rows_per_sec"] / o["apply_bound_m_rows_per_sec"], ">= 0.5")
            row(f"  {name} the push's check before the update (reads what it reads) vs the update's bound",
                f"{o['check_m_rows_per_sec']:.1f} M rows/s", f"bound {o['apply_bound_m_rows_per_sec']:.1f} M rows/s",
                o["check_m_rows_per_sec"] / o["apply_bound_m_rows_per_sec"], "")
            row(f"  {name} row pulls vs the same traffic (lookup and copy)",
                f"{o['pull_m_rows_per_sec']:.1f} M rows/s", f"bound {o['pull_bound_m_rows_per_sec']:.1f} M rows/s",
                o["pull_m_rows_per_sec"] / o["pull_bound_m_rows_per_sec"], ">= 0.5")
        row(f"2 embedding table, {size}: SparseAdam row updates vs dense Adam, per float",
            f"{e['adam']['apply_m_rows_per_sec'] * 16:.0f} M floats/s",
            f"dense Adam {a['adam_m_updates_per_sec']:.0f} M floats/s",
            e["adam"]["apply_m_rows_per_sec"] * 16 / a["adam_m_updates_per_sec"], "")
    for table_rows in server_rows:
        es = m["embedding-server"][str(table_rows)]
        row(f"2 two servers over gRPC, {table_rows / 1e6:g}M rows of dim 8 (row-wise Adagrad, 4 shards): bytes per row",
            f"{es['bytes_per_row']:.1f} B/row", f"minimum {es['minimum_bytes_per_row']:.0f} B (row + state)",
            es["minimum_bytes_per_row"] / es["bytes_per_row"], "<= 1.3x: >= 0.77")
        row("  pulls through the worker's client vs the shards' own pulls in process",
            f"{es['pull_m_rows_per_sec']:.1f} M rows/s", f"shards {es['direct_pull_m_rows_per_sec']:.1f} M rows/s",
            es["pull_m_rows_per_sec"] / es["direct_pull_m_rows_per_sec"], "")
        row("  pushes (each an update) through the client vs the shards' own",
            f"{es['push_m_rows_per_sec']:.1f} M rows/s", f"shards {es['direct_push_m_rows_per_sec']:.1f} M rows/s",
            es["push_m_rows_per_sec"] / es["direct_push_m_rows_per_sec"], "")
    sc = m["shard-copy"]
    row(f"2 a new backup's copy of an embedding shard, {shard_copy_rows / 1e6:g}M rows of dim 8 with Adagrad "
        f"({sc['bulk_mib']:.0f} MiB), until it serves", f"{sc['copy_s']:.2f} s",
        f"raw TCP loopback, the same bytes one way {sc['raw_tcp_s']:.2f} s", sc["raw_tcp_s"] / sc["copy_s"], "")
    row("  the longest a push to that shard waited meanwhile (the copy under the shard's lock)",
        f"{sc['push_wait_max_s']:.3f} s", f"the primary's whole export {sc['export_s']:.2f} s",
        sc["push_wait_max_s"] / sc["export_s"], "")
    row(f"2 a worker's export of that table ({sc['export_mib']:.0f} MiB of ids and rows), sorted by id",
        f"{sc['table_export_s']:.2f} s",
        f"raw TCP loopback, the same bytes one way {sc['export_raw_tcp_s']:.2f} s",
        sc["export_raw_tcp_s"] / sc["table_export_s"], "")
    row("  the longest a push to that shard waited meanwhile (a page under the shard's lock)",
        f"{sc['export_push_wait_max_s']:.3f} s", f"the whole export {sc['table_export_s']:.2f} s",
        sc["export_push_wait_max_s"] / sc["table_export_s"], "")
    r, runs = m["recovery"], results["recovery"]
    worst = max(s["resume_ms_max"] for s in runs)
    row(f"6 recovery: kill -9 of a primary ({int(sum(s['kills'] for s in runs))} kills), the workers continue on the "
        "new map, after detection", f"median {r['resume_ms_median']:.0f} ms, max {worst:.0f} ms",
        "goal 100 ms", worst / 100, "<= 1")
    row("  detection after the kill (failure_timeout_ms 3000)", f"median {r['detect_ms_median']:.0f} ms",
        "failure timeout 3000 ms", r["detect_ms_median"] / 3000, "<= 1.5")
    cp = m["control-plane"]
    for nodes in control_plane_sizes:
        c = cp[str(nodes)]
        shape = f"{int(c['servers'])} servers x {int(c['shards'])} shards, {int(c['workers'])} workers"
        row(f"7 control plane, {nodes} nodes ({shape}): heartbeats' share of a core at 2/s a node "
            "(the registry's work; gRPC's own not counted)", f"{c['heartbeat_us']:.2f} us each",
            "goal 10% of a core", c["heartbeat_core"] / 0.10, "<= 1")
        row(f"  a new map to every node: its bytes ({c['map_bytes'] / 1e3:.0f} kB x {nodes - 1}) at raw loopback speed",
            f"{c['map_publish_mb'] / (t['raw_tcp_gbps'] * 1e3):.3f} s", "goal 1 s",
            c["map_publish_mb"] / (t["raw_tcp_gbps"] * 1e3), "<= 1")
        row(f"  the {nodes - 1} answers to long polls a new map wakes, built and serialized: the map's bytes "
            "shared, against a copy each", f"{c['answer_us'] * (nodes - 1) / 1e6:.3f} s",
            f"copied {c['copied_answer_us'] * (nodes - 1) / 1e6:.3f} s", c["answer_us"] / c["copied_answer_us"], "")
        row("  one server's loss planned and its map sealed (signed), against the 1 s budget",
            f"{c['declare_dead_ms']:.2f} ms", "1 s", c["declare_dead_ms"] / 1000, "")
        row(f"  the {int(c['held_polls'])} workers' held long polls answered (built, serialized) after that "
            "map's publication", f"{c['polls_answered_ms']:.1f} ms", "1 s", c["polls_answered_ms"] / 1000, "<= 1")
    for servers, workers in scheduler_sizes:
        nodes = servers + workers
        sc = m[f"scheduler-{nodes}"]
        latency = f"heartbeat p50 {sc['heartbeat_p50_ms']:.2f} / p99 {sc['heartbeat_p99_ms']:.2f} ms"
        row(f"7 a real ps_scheduler, {nodes} simulated nodes over gRPC ({servers} servers): its CPU, heartbeats at "
            f"2/s a node; {sc['scheduler_rss_mb']:.0f} MB resident", f"{sc['scheduler_core'] * 100:.1f}% of a core",
            f"goal 10%; {latency}" + ("" if sc["sustained"] >= 1 else
                                     f"; NOT SUSTAINED: {sc['declared_dead']:.0f} live nodes declared dead"),
            sc["scheduler_core"] / 0.10, "<= 1")
        if sc["sustained"] >= 1 and "servers_map_ms" in sc:
            row("  a server's loss: the new map installed on every server / fetched by every worker, after the first "
                "install (workers here learn it from a heartbeat)",
                f"{sc['servers_map_ms']:.0f} / {sc['workers_map_ms']:.0f} ms", "goal 1000 ms",
                max(sc["servers_map_ms"], sc["workers_map_ms"]) / 1000, "<= 1")
    for mode, size in ours_configs:
        o = m[f"ours-{mode}-{size}"]
        ours_text = f"{o['samples_per_sec']:.0f}/s acc {o['test_accuracy']:.4f}"
        rpc, ddp, single = m[f"rpc-{size}"], m[f"ddp-{size}"], m["single"]
        label = f"3 e2e {mode} {size} server x {size} worker"
        row(f"{label} vs PyTorch RPC PS ({size} worker)", ours_text,
            f"{rpc['samples_per_sec']:.0f}/s acc {rpc['test_accuracy']:.4f}",
            o["samples_per_sec"] / rpc["samples_per_sec"], ">= 3")
        row(f"{label} vs DDP gloo ({size} worker)", ours_text,
            f"{ddp['samples_per_sec']:.0f}/s acc {ddp['test_accuracy']:.4f}",
            o["samples_per_sec"] / ddp["samples_per_sec"], "> 1")
        row(f"{label} vs one PyTorch process", ours_text,
            f"{single['samples_per_sec']:.0f}/s acc {single['test_accuracy']:.4f}",
            o["samples_per_sec"] / single["samples_per_sec"], "")

    for mode in ("sync", "async"):
        o, rpc, ddp = m[f"ours-{mode}-2-r1"], m["rpc-2"], m["ddp-2"]
        ours_text = f"{o['samples_per_sec']:.0f}/s acc {o['test_accuracy']:.4f}"
        label = f"3 e2e {mode} 2x2 with replication 1 (no backups, like the peers)"
        row(f"{label} vs PyTorch RPC PS", ours_text, f"{rpc['samples_per_sec']:.0f}/s acc {rpc['test_accuracy']:.4f}",
            o["samples_per_sec"] / rpc["samples_per_sec"], ">= 3")
        row(f"{label} vs DDP gloo", ours_text, f"{ddp['samples_per_sec']:.0f}/s acc {ddp['test_accuracy']:.4f}",
            o["samples_per_sec"] / ddp["samples_per_sec"], "> 1")

    # 5: replication's cost per step. With R=2 each step's entries (a server's half of the
    # model) go to the backup, acknowledged on receipt: at most one loopback round trip more.
    rt = m["round-trip"]
    for mode in ("sync", "async"):
        r2, r1 = m[f"ours-{mode}-2"], m[f"ours-{mode}-2-r1"]
        extra_ms = (BATCH * 2 / r2["samples_per_sec"] - BATCH * 2 / r1["samples_per_sec"]) * 1e3
        row(f"5 replication: {mode} 2x2, R=2 step time minus R=1's vs one loopback round trip "
            f"({REFERENCE_PARAMETERS // 2} floats each way, raw TCP)", f"{extra_ms:+.3f} ms/step",
            f"round trip {rt['raw_round_trip_ms']:.3f} ms", extra_ms / rt["raw_round_trip_ms"], "<= 1")
        row(f"  {mode} 2x2 samples/s, R=2 vs R=1", f"{r2['samples_per_sec']:.0f}/s acc {r2['test_accuracy']:.4f}",
            f"{r1['samples_per_sec']:.0f}/s acc {r1['test_accuracy']:.4f}",
            r2["samples_per_sec"] / r1["samples_per_sec"], "")
    row("  the same round trip through our push+pull (gRPC)", f"{rt['ours_round_trip_ms']:.3f} ms",
        f"raw TCP {rt['raw_round_trip_ms']:.3f} ms", rt["raw_round_trip_ms"] / rt["ours_round_trip_ms"], "")

    base = m["ours-sync-2"]
    for dtype in ("bfloat16", "float16"):
        o = m[f"ours-sync-2-{dtype}"]
        row(f"3 e2e sync 2x2, wire_dtype {dtype} vs float32", f"{o['samples_per_sec']:.0f}/s acc {o['test_accuracy']:.4f}",
            f"{base['samples_per_sec']:.0f}/s acc {base['test_accuracy']:.4f}",
            o["samples_per_sec"] / base["samples_per_sec"], "")

    o, base = m["wide-sync-1-bucket1024"], m["wide-sync-1-bucket0"]
    row(f"3 e2e sync 1x1 {WIDE_LAYERS} MLP, {wide_steps} steps: push in 1 MiB buckets vs after backprop",
        f"{o['samples_per_sec']:.0f}/s acc {o['test_accuracy']:.4f}",
        f"{base['samples_per_sec']:.0f}/s acc {base['test_accuracy']:.4f}",
        o["samples_per_sec"] / base["samples_per_sec"], "")

    o, base = m["ours-async-1-overlap"], m["ours-async-1"]
    row("3 e2e async 1x1, overlap vs not", f"{o['samples_per_sec']:.0f}/s acc {o['test_accuracy']:.4f}",
        f"{base['samples_per_sec']:.0f}/s acc {base['test_accuracy']:.4f}",
        o["samples_per_sec"] / base["samples_per_sec"], "")

    # 4: the communication lower bound per step, against where the system stands.
    # Every worker sends and receives the whole model once per step; on this machine all
    # of it crosses one loopback, whose speed the transport benchmark measured (GB/s of
    # push+pull bytes).
    model_bytes = 4 * REFERENCE_PARAMETERS
    loopback = t["raw_tcp_gbps"] * 1e9
    scaling = []
    for mode, size in ours_configs:
        o = m[f"ours-{mode}-{size}"]
        step_seconds = BATCH * size / o["samples_per_sec"]
        bound_seconds = 2 * model_bytes * size / loopback
        compute_seconds = o.get("step_compute_ms", float("nan")) / 1e3
        scaling.append((mode, size, step_seconds, bound_seconds, compute_seconds))
        row(f"4 scaling: {mode} {size}x{size} step time vs comm. bound + compute",
            f"{step_seconds * 1e3:.2f} ms/step",
            f"bound {bound_seconds * 1e3:.3f} + compute {compute_seconds * 1e3:.3f} ms",
            (bound_seconds + compute_seconds) / step_seconds, "")

    print()
    steps_cap = f" (at most {e2e_steps} steps)" if e2e_steps else ""
    print(f"bench/run.sh: {args.repeats} repeat(s), medians; e2e jobs of {args.epochs} epoch(s){steps_cap}, "
          f"batch {BATCH} per worker; {os.cpu_count()} CPUs; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
    print_table(rows)

    # The scaling model: per-step time = compute + fixed per-step overhead + the busier of
    # a worker's link (the model each way) and a server's link (its 1/S of the model for
    # each of W workers, each way), links full duplex at LINK_GBPS. Compute and overhead
    # are this run's 1x1 sync figures; the overhead is what the 1x1 step took beyond
    # compute and its loopback bound.
    one = next(s for s in scaling if s[0] == "sync" and s[1] == 1)
    overhead = max(0.0, one[2] - one[3] - one[4])
    link = float(os.environ.get("LINK_GBPS", "10")) * 1e9 / 8
    print()
    print(f"scaling model (samples/s), reference MLP, {link * 8 / 1e9:.0f} Gb/s links, compute {one[4] * 1e3:.3f} ms "
          f"and overhead {overhead * 1e3:.3f} ms per step from this run; bound = communication alone")
    workers_list, servers_list = (1, 2, 4, 8, 16, 32), (1, 2, 4, 8)
    print("workers " + "".join(f"  S={s:<2} model/bound   " for s in servers_list))
    for w in workers_list:
        cells = []
        for s in servers_list:
            comm = max(model_bytes / link, model_bytes * w / (s * link))
            model_rate = w * BATCH / (one[4] + overhead + comm)
            bound_rate = w * BATCH / comm
            cells.append(f"{model_rate:>8.0f}/{bound_rate:<10.0f}")
        print(f"{w:>7} " + "".join(f"  {c:<19}" for c in cells))

    unmeasured = [r[0] for r in rows if r[3] in ("nan", "inf")]
    if unmeasured:
        print(f"bench: no figure for: {', '.join(unmeasured)}", file=sys.stderr)
        sys.exit(1)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": m, "samples": results}, f, indent=1)


if __name__ == "__main__":
    main()
