#!/usr/bin/python3
"""The CTR benchmarks (docs/SPARSE.md has the table from a full run). Prints figures, one
table of ratios measured in the same run:

  1  accuracy: the CTR job (deploy/local/ctr.yaml's model, 2 servers x 2 workers, sync)
     against one PyTorch process with the same model, data, epochs and effective batch;
     both test AUCs;
  2  samples/s against that process and against a parameter server on
     torch.distributed.rpc holding the tables (bench/ctr_peers.py), both 2 workers, no
     replication on either side; with the job's MLP, and with a small one (429-32-1),
     where the step is the parameter server's work rather than the model's;
  3  samples/s as the unique ids per batch grow (the vocabulary from 100 to 1M ids per
     field; 1 server x 1 worker, batch 256);
  4  scale: a job whose tables grow past 20 million rows across 2 servers; the worker's
     resident memory at 1M and at 20M rows, and the servers' bytes per row against the
     minimum;
  5  hybrid (training.embedding_mode: async, PERSIA's): async tables under the sync dense
     part, against the full sync job: test AUC and samples/s;
  6  checkpoints (checkpoint.embedding_deltas): a delta checkpoint of an embedding shard
     with 1% of its rows changed against a full one, bytes and write time, at 1M and 20M
     rows (dim 16, row-wise Adagrad; bench/embedding_checkpoint_bench), and a restore
     through base + delta against the full file's.

  bench/ctr_bench.py --root ROOT [--repeats N] [--quick]
(--quick: small data, 1 repeat, a smoke run of every part.)
"""
import gzip
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_all import key_values, log, print_table, run, table_arguments  # noqa: E402


def generate(root, out, examples, test_examples, vocabulary=100000, zipf=1.1):
    os.makedirs(out, exist_ok=True)
    line = run([f"{root}/bazel-bin/tools/ps_ctr_generate", "--out", out, "--train_examples", str(examples),
                "--test_examples", str(test_examples), "--vocabulary", str(vocabulary),
                "--zipf_exponent", str(zipf)], timeout=1800)
    return key_values(line)


def config(data, servers, workers, replication, epochs, batch=256, layers="[429, 256, 128, 1]", shuffle=True,
           max_steps=0, mode="sync", embedding_mode=None):
    return f"""cluster:
  scheduler: 127.0.0.1:0
  servers: {servers}
  workers: {workers}
  shards: 4
  embedding_shards: 8
  replication: {replication}
model:
  type: ctr
  embedding_dim: 16
  layers: {layers}
training:
  mode: {mode}
{f"  embedding_mode: {embedding_mode}" if embedding_mode else ""}
  batch_size: {batch}
  epochs: {epochs}
  max_steps: {max_steps}
  shuffle: {str(shuffle).lower()}
  optimizer: {{type: adam, learning_rate: 0.001}}
  embedding_optimizer: {{type: adam, learning_rate: 0.01}}
data:
  train: {data}/train.tsv.gz
  test: {data}/test.tsv.gz
"""


def ours(root, workdir, tag, text, poll=None):
    path = f"{workdir}/{tag}.yaml"
    with open(path, "w") as f:
        f.write(text)
    run_dir = f"{workdir}/{tag}-run"
    command = [f"{root}/deploy/local/run.sh"] + (["--metrics"] if poll else []) + [path]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "PS_RUN_DIR": run_dir})
    polled = {}
    # Often: a quick run's scale job makes its 480,000 rows in about a second (at 0.5 s
    # a poll saw 97,785 and then none: the servers had exited).
    while poll and process.poll() is None:
        poll(run_dir, polled)
        time.sleep(0.1)
    out = process.communicate(timeout=7200)[0]
    if process.returncode != 0:
        raise RuntimeError(f"{tag}: run.sh exited {process.returncode}:\n{out[-2000:]}")
    figures = key_values(out.strip().splitlines()[-1])
    figures.update(polled)
    subprocess.run(["rm", "-rf", run_dir])
    return figures


def peer(root, kind, data, epochs, hidden="256,128"):
    out = run(["/usr/bin/python3", f"{root}/bench/ctr_peers.py", "--peer", kind, "--data", data, "--workers", "2",
               "--epochs", str(epochs), "--hidden", hidden], timeout=7200)
    return key_values([line for line in out.splitlines() if line.startswith("peer=")][-1])


def unique_ids_per_batch(data, batch):
    """The mean count of distinct (field, id) per batch of `batch` examples in file order."""
    total, batches, seen = 0, 0, set()
    with gzip.open(f"{data}/train.tsv.gz", "rt") as f:
        for n, line in enumerate(f, 1):
            for k, v in enumerate(line.rstrip("\n").split("\t")[14:]):
                if v:
                    seen.add((k, v))
            if n % batch == 0:
                total, batches, seen = total + len(seen), batches + 1, set()
    return total / max(batches, 1)


def metric_sum(port, name):
    """The sum of `name` over the primaries' shards on the server serving /metrics at `port`."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    return sum(float(v) for v in re.findall(rf'^{name}{{[^}}]*role="primary"[^}}]*}} ([0-9.e+]+)$', text, re.M))


def scale_poll(thresholds):
    """Polls the servers' rows and the worker's resident memory, noting it at each threshold."""
    ports = {}  # server log -> its metrics port, read once found

    def poll(run_dir, figures):
        try:
            for name in os.listdir(run_dir):
                if name.startswith("server-") and name.endswith(".log") and name not in ports:
                    with open(f"{run_dir}/{name}") as f:
                        found = re.search(r"metrics on http://127\.0\.0\.1:([0-9]+)/metrics", f.read())
                    if found:
                        ports[name] = found.group(1)
            rows = sum(metric_sum(p, "ps_embedding_rows") for p in ports.values())
            table_bytes = sum(metric_sum(p, "ps_embedding_bytes") for p in ports.values())
            with open(f"{run_dir}/worker-0.pid") as f:
                pid = f.read().strip()
            with open(f"/proc/{pid}/status") as f:
                rss_mb = int(re.search(r"VmRSS:\s+([0-9]+) kB", f.read()).group(1)) / 1024
        except (OSError, ValueError, AttributeError, urllib.error.URLError):
            return  # not up yet, or gone
        if rows >= figures.get("rows", 0):
            figures["rows"], figures["bytes_per_row"] = rows, table_bytes / max(rows, 1)
        for threshold in thresholds:
            if rows >= threshold and f"rss_mb_at_{threshold}" not in figures:
                figures[f"rss_mb_at_{threshold}"] = rss_mb
        figures["rss_mb_last"] = rss_mb
    return poll


def main():
    args = table_arguments()
    examples, test_examples = (20000, 2000) if args.quick else (200000, 20000)
    sweep_examples = 8000 if args.quick else 60000
    scale_examples = 20000 if args.quick else 900000
    thresholds = (20000, 100000) if args.quick else (1000000, 20000000)
    epochs = 1
    results = {}

    def record(name, function, *function_args):
        log(f"ctr {name} ...")
        results.setdefault(name, []).append(function(*function_args))

    with tempfile.TemporaryDirectory(prefix="ps-ctr-bench.") as workdir:
        data = f"{workdir}/data"
        best = generate(args.root, data, examples, test_examples)["best_test_auc"]
        for repeat in range(args.repeats):
            log(f"ctr repeat {repeat + 1} of {args.repeats}")
            record("ours", ours, args.root, workdir, "ours", config(data, 2, 2, 1, epochs))
            record("single", peer, args.root, "single", data, epochs)
            record("rpc", peer, args.root, "rpc", data, epochs)
            # A small MLP: the step is the parameter server's work, not the model's.
            record("ours-small", ours, args.root, workdir, "ours-small",
                   config(data, 2, 2, 1, epochs, layers="[429, 32, 1]"))
            record("rpc-small", peer, args.root, "rpc", data, epochs, "32")
            # The RPC peer applies each push as it comes: async is its like.
            record("ours-async", ours, args.root, workdir, "ours-async",
                   config(data, 2, 2, 1, epochs, mode="async"))
            record("ours-async-small", ours, args.root, workdir, "ours-async-small",
                   config(data, 2, 2, 1, epochs, layers="[429, 32, 1]", mode="async"))
            # PERSIA's hybrid: the tables async, the MLP sync.
            record("ours-hybrid", ours, args.root, workdir, "ours-hybrid",
                   config(data, 2, 2, 1, epochs, embedding_mode="async"))
        sweep = []
        for vocabulary in (100, 10000, 1000000):
            sweep_data = f"{workdir}/sweep-{vocabulary}"
            generate(args.root, sweep_data, sweep_examples, 1000, vocabulary)
            unique = unique_ids_per_batch(sweep_data, 256)
            log(f"ctr sweep, vocabulary {vocabulary} ...")
            figures = ours(args.root, workdir, f"sweep-{vocabulary}",
                           config(sweep_data, 1, 1, 1, 1, shuffle=False))
            sweep.append((vocabulary, unique, figures["samples_per_sec"]))
            subprocess.run(["rm", "-rf", sweep_data])
        scale_data = f"{workdir}/scale"
        generate(args.root, scale_data, scale_examples, 1000, 1 << 28, 0.6)
        log(f"ctr scale: {scale_examples} examples of nearly unique ids ...")
        scale = ours(args.root, workdir, "scale",
                     config(scale_data, 2, 1, 1, 1, batch=1024, layers="[429, 32, 1]"), scale_poll(thresholds))
        checkpoints = []
        for rows in thresholds:
            log(f"ctr checkpoints: full vs delta at {rows} rows ...")
            out = run([f"{args.root}/bazel-bin/bench/embedding_checkpoint_bench", str(rows), "1", "16",
                       str(args.repeats), tempfile.mkdtemp(dir=workdir)], timeout=3600)
            checkpoints.append(key_values(out.strip().splitlines()[-1]))

    m = {name: {key: statistics.median(s[key] for s in samples) for key in samples[0]}
         for name, samples in results.items()}
    o, single, rpc = m["ours"], m["single"], m["rpc"]
    rows = [
        ("ctr 1 accuracy: test AUC, 2x2 sync vs one PyTorch process (same model, epochs, batch)",
         f"{o['test_auc']:.4f}", f"{single['test_auc']:.4f} (best achievable {best:.4f})",
         f"{o['test_auc'] - single['test_auc']:+.4f}", "within 0.02"),
        ("ctr 2 samples/s, 2x2 (replication 1) vs PyTorch RPC PS holding the tables (2 workers)",
         f"{o['samples_per_sec']:.0f}/s", f"{rpc['samples_per_sec']:.0f}/s (AUC {rpc['test_auc']:.4f})",
         f"{o['samples_per_sec'] / rpc['samples_per_sec']:.2f}", ">= 3"),
        ("ctr 2 the same with an MLP 429-32-1 (the step is the PS's work, not the model's)",
         f"{m['ours-small']['samples_per_sec']:.0f}/s", f"{m['rpc-small']['samples_per_sec']:.0f}/s",
         f"{m['ours-small']['samples_per_sec'] / m['rpc-small']['samples_per_sec']:.2f}", ">= 3"),
        ("ctr 2 async 2x2 (each push applied as it comes, as the RPC PS does) vs the RPC PS",
         f"{m['ours-async']['samples_per_sec']:.0f}/s (AUC {m['ours-async']['test_auc']:.4f})",
         f"{rpc['samples_per_sec']:.0f}/s (AUC {rpc['test_auc']:.4f})",
         f"{m['ours-async']['samples_per_sec'] / rpc['samples_per_sec']:.2f}", ">= 3"),
        ("ctr 2 async 2x2 with an MLP 429-32-1 vs the RPC PS with it",
         f"{m['ours-async-small']['samples_per_sec']:.0f}/s", f"{m['rpc-small']['samples_per_sec']:.0f}/s",
         f"{m['ours-async-small']['samples_per_sec'] / m['rpc-small']['samples_per_sec']:.2f}", ">= 3"),
        ("ctr 2 samples/s, 2x2 vs one PyTorch process (EmbeddingBag sparse + SparseAdam)",
         f"{o['samples_per_sec']:.0f}/s", f"{single['samples_per_sec']:.0f}/s",
         f"{o['samples_per_sec'] / single['samples_per_sec']:.2f}", ""),
        ("ctr 5 hybrid 2x2 (tables async, MLP sync) vs sync: test AUC",
         f"{m['ours-hybrid']['test_auc']:.4f}", f"{o['test_auc']:.4f}",
         f"{m['ours-hybrid']['test_auc'] - o['test_auc']:+.4f}", "within 0.01"),
        ("ctr 5 hybrid 2x2 vs sync: samples/s",
         f"{m['ours-hybrid']['samples_per_sec']:.0f}/s", f"{o['samples_per_sec']:.0f}/s",
         f"{m['ours-hybrid']['samples_per_sec'] / o['samples_per_sec']:.2f}", "> 1"),
    ]
    for vocabulary, unique, rate in sweep:
        rows.append((f"ctr 3 1x1, {vocabulary} ids per field: {unique:.0f} unique ids per batch of 256",
                     f"{rate:.0f}/s", f"{sweep[0][2]:.0f}/s at {sweep[0][1]:.0f} unique",
                     f"{rate / sweep[0][2]:.2f}", ""))
    low, high = thresholds
    rows.append((f"ctr 4 scale: rows made across 2 servers ({scale_examples} examples)", f"{scale.get('rows', 0):.0f}",
                 f"{high} wanted", f"{scale.get('rows', 0) / high:.2f}", ">= 1"))
    rows.append((f"ctr 4 worker RSS at {high} rows vs at {low} rows",
                 f"{scale.get(f'rss_mb_at_{high}', float('nan')):.0f} MB",
                 f"{scale.get(f'rss_mb_at_{low}', float('nan')):.0f} MB",
                 f"{scale.get(f'rss_mb_at_{high}', float('nan')) / scale.get(f'rss_mb_at_{low}', float('nan')):.2f}",
                 "~1 (flat)"))
    rows.append(("ctr 4 server bytes per row (dim 16, Adam) vs the minimum", f"{scale.get('bytes_per_row', 0):.0f} B",
                 "192 B (row + 2 moments)", f"{192 / max(scale.get('bytes_per_row', 1), 1):.2f}", ">= 0.6"))
    rows.append(("ctr 4 samples/s of the scale job (1 worker, batch 1024, MLP 429-32-1)",
                 f"{scale['samples_per_sec']:.0f}/s", "", "", ""))
    for c in checkpoints:
        n = f"{c['rows']:.0f} rows, {c['touched']:.0f} touched"
        rows.append((f"ctr 6 delta checkpoint bytes vs full ({n})", f"{c['delta_bytes'] / 1e6:.1f} MB",
                     f"{c['full_bytes'] / 1e6:.1f} MB", f"{c['delta_bytes'] / c['full_bytes']:.4f}", "~0.01"))
        rows.append((f"ctr 6 delta checkpoint write time vs full ({n})", f"{c['delta_write_s']:.3f} s",
                     f"{c['full_write_s']:.3f} s", f"{c['delta_write_s'] / c['full_write_s']:.4f}", "~0.01"))
        rows.append((f"ctr 6 restore of full + 1 delta vs the full file alone ({n})",
                     f"{c['chain_restore_s']:.3f} s", f"{c['full_restore_s']:.3f} s",
                     f"{c['chain_restore_s'] / c['full_restore_s']:.2f}", ""))
    print()
    print(f"bench/ctr_bench.py: {args.repeats} repeat(s), medians; {examples} training examples, {epochs} epoch(s); "
          f"{os.cpu_count()} CPUs; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
    print_table(rows)
    if any("nan" in r[3] for r in rows):
        print("ctr_bench: a figure is missing", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
