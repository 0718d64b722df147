#!/usr/bin/python3
"""Checks and runs the Kubernetes manifests deploy/k8s/render.py writes (no API server can
be installed here, so this is what can be tested honestly).

  k8s_manifests.py check SPEC MANIFESTS BIN_DIR
      every object parses and is what a job needs: names, labels and selectors, ports
      and probes, volumes and mounts, the Secret's keys and the ConfigMap's files against
      the paths the daemons are given, every flag one the daemon accepts (its --helpfull
      in BIN_DIR), the counts and the disruption budget from SPEC.
  k8s_manifests.py run MANIFESTS WORK_DIR
      runs each pod template's container (its image, args with $(VAR) expanded as the
      kubelet expands them, env, user, mounts: the ConfigMap's files, the Secret's with
      its mode and group, the state volume) with podman, in one pod without a network,
      the Services' names in /etc/hosts; the scheduler Job's one pod, the StatefulSet's
      replicas, the worker Job's parallelism. What it changes: every container shares
      the one pod's loopback (where Kubernetes gives each pod its own address), so each
      server and worker replica listens and advertises on 127.0.0.1 at its port plus
      10 x its replica number, with metrics on a free port. It runs no probe and no
      restart policy. Prints the scheduler's final line; exit 0 when the job finished,
      and no container is left either way.
Prints "ok: ..." per check, "FAILED: ..." per failure; exit 1 on any failure.
"""
import os
import re
import secrets
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy"))
import cluster_spec  # noqa: E402

failures = 0


def check(what, condition):
    global failures
    print(("ok: " if condition else "FAILED: ") + what)
    if not condition:
        failures += 1


def load(path):
    with open(path) as f:
        return [o for o in yaml.safe_load_all(f) if o is not None]


def by_kind(objects):
    out = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def workloads(objects):
    """(name, component, pod template, replicas) of each Job and StatefulSet."""
    out = []
    for o in objects:
        if o["kind"] == "StatefulSet":
            out.append((o["metadata"]["name"], o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"],
                        o["spec"]["template"], o["spec"]["replicas"]))
        elif o["kind"] == "Job":
            out.append((o["metadata"]["name"], o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"],
                        o["spec"]["template"], o["spec"].get("parallelism", 1)))
    return out


def daemon_flags(bin_dir, component):
    binary = {"scheduler": "scheduler/ps_scheduler", "server": "ps/ps_server", "worker": "worker/ps_worker"}[component]
    out = subprocess.run([os.path.join(bin_dir, binary), "--helpfull"], capture_output=True, text=True)
    return set(re.findall(r"^\s+--([a-z_0-9]+) ", out.stdout + out.stderr, re.M))


def check_manifests(spec_path, manifests, bin_dir):
    spec = cluster_spec.load(spec_path)
    objects = load(manifests)
    kinds = by_kind(objects)
    check(f"{len(objects)} objects parse, each with apiVersion, kind, name and namespace",
          all(o.get("apiVersion") and o.get("kind") and o["metadata"].get("name") and o["metadata"].get("namespace")
              for o in objects))
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    check("no two objects of a kind share a name", len(names) == len(set(names)))
    check("every object is labelled with the job", len({o["metadata"]["labels"]["app.kubernetes.io/instance"]
                                                         for o in objects}) == 1)
    configmap = kinds["ConfigMap"][0]
    check("the ConfigMap holds the spec verbatim", configmap["data"]["cluster.yaml"] == spec["_text"])
    for name, _ in cluster_spec.command_files(spec):
        check(f"the ConfigMap holds the worker's {name}", name in configmap["data"])
    secret = kinds.get("Secret", [None])[0]
    if secret:
        tokens = secret["stringData"]
        check("the Secret holds a cluster and an admin token of 64 hex digits, different",
              all(re.fullmatch(r"[0-9a-f]{64}", tokens.get(k, "")) for k in ("cluster-token", "admin-token"))
              and tokens["cluster-token"] != tokens["admin-token"])
    services = {s["metadata"]["name"]: s for s in kinds["Service"]}
    work = workloads(objects)
    counts = {component: replicas for _, component, _, replicas in work}
    check(f"servers {cluster_spec.servers(spec)} and workers {cluster_spec.workers(spec)} as the spec says",
          counts.get("server") == cluster_spec.servers(spec) and counts.get("worker") == cluster_spec.workers(spec)
          and counts.get("scheduler") == 1)
    budgets = {p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]: p
               for p in kinds["PodDisruptionBudget"]}
    check(f"the servers' disruption budget lets replication - 1 = {cluster_spec.replication(spec) - 1} go at once",
          budgets["server"]["spec"]["maxUnavailable"] == cluster_spec.replication(spec) - 1)
    check("the scheduler's disruption budget lets none go", budgets["scheduler"]["spec"]["maxUnavailable"] == 0)
    for workload, component, template, _ in work:
        labels = template["metadata"]["labels"]
        pod = template["spec"]
        for owner in objects:
            selector = owner.get("spec", {}).get("selector") if owner["kind"] != "Job" else None
            if isinstance(selector, dict) and "matchLabels" in selector:
                selector = selector["matchLabels"]
            if owner["kind"] in ("Service", "StatefulSet", "PodDisruptionBudget") and selector and \
                    selector.get("app.kubernetes.io/component") == component:
                check(f"{owner['kind']} {owner['metadata']['name']} selects {workload}'s pods",
                      all(labels.get(k) == v for k, v in selector.items()))
        check(f"{workload} runs as uid 10001, not root, with fsGroup 10001 (the Secret's group)",
              pod["securityContext"].get("runAsUser") == 10001 and pod["securityContext"].get("runAsNonRoot")
              and pod["securityContext"].get("fsGroup") == 10001)
        volumes = {v["name"]: v for v in pod["volumes"]}
        (c,) = pod["containers"]
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        check(f"{workload}'s mounts name its volumes", all(m["name"] in volumes for m in mounts.values()))
        args = c["args"]
        check(f"{workload} starts the image's `paramserver {component}`", args[0] == component)
        flags = daemon_flags(bin_dir, component)
        given = [a[2:] for a in args[1:] if a.startswith("--")]
        check(f"{workload}'s flags are {component}'s own ({', '.join(given)})",
              bool(flags) and all(f in flags for f in given))
        values = dict(zip(given, [args[args.index("--" + f) + 1] for f in given]))
        # Every file a flag names lies in a mounted volume that holds it.
        for flag in ("config", "cluster_token_file", "admin_token_file", "state_file", "report_file"):
            if flag not in values:
                continue
            path = values[flag]
            folder = os.path.dirname(path)
            check(f"{workload} --{flag} {path} is in a mounted volume", folder in mounts)
            if folder not in mounts:
                continue
            volume = volumes[mounts[folder]["name"]]
            file_name = os.path.basename(path)
            if "configMap" in volume:
                check(f"  the ConfigMap holds {file_name}", file_name in configmap["data"])
            elif "secret" in volume:
                check(f"  the Secret's files: {file_name}, mode 0440 (the daemons refuse one others can read)",
                      (secret is None or file_name in secret["stringData"]) and volume["secret"]["defaultMode"] == 0o440)
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                check(f"  the state volume {claim} is a claim of the job", ("PersistentVolumeClaim", claim) in names)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        listen = int(values.get("listen", ":0").rsplit(":", 1)[1])
        check(f"{workload} listens on its grpc port {ports.get('grpc')}, probed there (gRPC health)",
              listen == ports.get("grpc") == c["readinessProbe"]["grpc"]["port"] == c["livenessProbe"]["grpc"]["port"])
        check(f"{workload}'s metrics port is annotated for Prometheus",
              int(values["metrics_port"]) == ports["metrics"] ==
              int(template["metadata"]["annotations"]["prometheus.io/port"]) and values.get("metrics_host") == "0.0.0.0")
        if "scheduler" in values:
            host, port = values["scheduler"].rsplit(":", 1)
            service, namespace = host.split(".")[:2]
            check(f"{workload} finds the scheduler through Service {service} in its namespace, port {port}",
                  service in services and namespace == services[service]["metadata"]["namespace"]
                  and any(p["port"] == int(port) for p in services[service]["spec"]["ports"]))
            check(f"{workload} advertises its pod's address", values.get("advertise") == f"$(POD_IP):{listen}" and
                  any(e["name"] == "POD_IP" for e in c["env"]))
        restart = pod["restartPolicy"]
        if component == "server":
            check(f"{workload}'s restartPolicy is Always (a StatefulSet)", restart == "Always")
        else:
            owner = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] == workload][0]
            rules = owner["spec"].get("podFailurePolicy", {}).get("rules", [])
            fail_codes = [r["onExitCodes"] for r in rules if r["action"] == "FailJob" and "onExitCodes" in r]
            check(f"{workload}: restartPolicy Never, exits 2 and 3 fail the Job, evictions are not failures",
                  restart == "Never" and len(fail_codes) == 1 and fail_codes[0]["values"] == [2, 3]
                  and fail_codes[0]["containerName"] == c["name"]
                  and any(r["action"] == "Ignore" for r in rules))
        check(f"{workload} is probed at start-up for up to 30 minutes",
              c["startupProbe"]["grpc"]["port"] == ports.get("grpc")
              and c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800)
        check(f"{workload}'s pod takes the runtime's default seccomp profile and drops every capability",
              pod["securityContext"].get("seccompProfile", {}).get("type") == "RuntimeDefault"
              and c["securityContext"]["capabilities"]["drop"] == ["ALL"])
        volume_names = {v.get("configMap", {}).get("name") or v.get("secret", {}).get("secretName")
                        for v in pod["volumes"]}
        check(f"{workload} mounts the job's ConfigMap and Secret, as the job's service account",
              configmap["metadata"]["name"] in volume_names
              and (secret is None or secret["metadata"]["name"] in volume_names)
              and pod["serviceAccountName"] in {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"})
    for name, service in services.items():
        component = service["spec"]["selector"]["app.kubernetes.io/component"]
        (template,) = [t for _, comp, t, _ in work if comp == component]
        container_ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
        check(f"Service {name}'s target ports are its pods' ({', '.join(str(p['targetPort']) for p in service['spec']['ports'])})",
              all(p["targetPort"] in container_ports for p in service["spec"]["ports"]))


def run_manifests(manifests, work_dir):
    objects = load(manifests)
    kinds = by_kind(objects)
    namespace = objects[0]["metadata"]["namespace"]
    pod = "k8s-" + secrets.token_hex(4)
    containers = []
    try:
        # The volumes as the kubelet makes them.
        configmap = kinds["ConfigMap"][0]
        spec_dir = os.path.join(work_dir, "configmap")
        os.makedirs(spec_dir)
        for name, text in configmap["data"].items():
            with open(os.path.join(spec_dir, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(spec_dir, name), 0o644)
        secret_dir = os.path.join(work_dir, "secret")
        os.makedirs(secret_dir)
        os.chmod(secret_dir, 0o755)
        for name, value in kinds["Secret"][0]["stringData"].items():
            path = os.path.join(secret_dir, name)
            with open(path, "w") as f:
                f.write(value)
            os.chown(path, 0, 10001)  # fsGroup
            os.chmod(path, 0o440)  # defaultMode
        claim_dir = os.path.join(work_dir, "claim")
        os.makedirs(claim_dir)
        os.chown(claim_dir, 0, 10001)
        os.chmod(claim_dir, 0o770)
        with open(os.path.join(work_dir, "hosts"), "w") as f:
            names = " ".join(f"{s['metadata']['name']}.{namespace}.svc" for s in kinds["Service"])
            f.write(f"127.0.0.1\tlocalhost {names}\n")
        os.chmod(os.path.join(work_dir, "hosts"), 0o644)
        subprocess.run(["podman", "pod", "create", "--name", pod, "--network", "none"], check=True,
                       stdout=subprocess.DEVNULL)
        order = {"scheduler": 0, "server": 1, "worker": 2}
        for workload, component, template, replicas in sorted(workloads(objects), key=lambda w: order[w[1]]):
            spec = template["spec"]
            (c,) = spec["containers"]
            volumes = {v["name"]: v for v in spec["volumes"]}
            for replica in range(replicas):
                name = f"{pod}-{workload}-{replica}"
                env = {"POD_IP": "127.0.0.1"}
                command = ["podman", "run", "-d", "--pod", pod, "--name", name,
                           "--user", f"{spec['securityContext']['runAsUser']}:{spec['securityContext']['runAsGroup']}",
                           "--group-add", str(spec["securityContext"]["fsGroup"]),
                           "-v", f"{work_dir}/hosts:/etc/hosts:ro"]
                for e in c["env"]:
                    if "value" in e:
                        env[e["name"]] = e["value"]
                for key, value in env.items():
                    command += ["-e", f"{key}={value}"]
                for m in c["volumeMounts"]:
                    volume = volumes[m["name"]]
                    source = spec_dir if "configMap" in volume else secret_dir if "secret" in volume else claim_dir
                    command += ["-v", f"{source}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"]
                # The kubelet expands $(VAR) in args from the container's environment.
                args = [re.sub(r"\$\(([A-Z_]+)\)", lambda v: env[v.group(1)], a) for a in c["args"]]
                # Every daemon in one pod shares its ports: each replica gets its own.
                if component != "scheduler":
                    port = int(args[args.index("--listen") + 1].rsplit(":", 1)[1]) + 10 * replica
                    args[args.index("--listen") + 1] = f"0.0.0.0:{port}"
                    args[args.index("--advertise") + 1] = f"127.0.0.1:{port}"
                    args[args.index("--metrics_port") + 1] = "0"
                subprocess.run(command + [c["image"]] + args, check=True, stdout=subprocess.DEVNULL)
                containers.append(name)
        scheduler = containers[0]
        deadline = time.time() + 600
        while time.time() < deadline:
            state = subprocess.run(["podman", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", scheduler],
                                   capture_output=True, text=True).stdout.strip()
            if state.startswith("exited"):
                break
            time.sleep(0.5)
        logs = subprocess.run(["podman", "logs", scheduler], capture_output=True, text=True)
        with open(os.path.join(work_dir, "scheduler.log"), "w") as f:
            f.write(logs.stdout + logs.stderr)
        final = re.findall(r"final test_accuracy=\S+ samples_per_sec=\d+ steps=\d+", logs.stdout + logs.stderr)
        check(f"the rendered pods ran the job to its end ({state})", state == "exited 0" and bool(final))
        if final:
            print(final[-1])
        for name in containers[1:]:
            out = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
            with open(os.path.join(work_dir, name.split(pod + "-")[1] + ".log"), "w") as f:
                f.write(out.stdout + out.stderr)
    finally:
        subprocess.run(["podman", "pod", "rm", "-f", "-t", "5", pod], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    left = subprocess.run(["podman", "ps", "-a", "-q", "--filter", f"pod={pod}"], capture_output=True, text=True)
    check("no container of the pod is left", left.stdout.strip() == "")


def main(argv):
    if len(argv) == 4 and argv[0] == "check":
        try:
            check_manifests(argv[1], argv[2], argv[3])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            check(f"the manifests have what a job needs (missing or malformed: {e!r})", False)
    elif len(argv) == 3 and argv[0] == "run":
        run_manifests(argv[1], argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
