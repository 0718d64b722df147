#!/usr/bin/python3
"""Runs a cloud-config user data file as cloud-init would on first boot, for tests.

Only the modules our user data uses: write_files (path, content, encoding b64 or text,
permissions, owner), then runcmd (each entry a list run without a shell, or a string run
by /bin/sh), in order; a failing command stops the run with its exit status, as a failed
boot script would. Any other top-level key is refused, so a key added to the template
is never silently skipped here. Gzipped user data (as launch.py hands it to EC2) is
read as cloud-init reads it.

Usage: run_cloud_init.py USER_DATA
"""
import base64
import gzip
import os
import pwd
import grp
import subprocess
import sys

import yaml

SUPPORTED = {"write_files", "runcmd"}


def main(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8")
    if not text.startswith("#cloud-config\n"):
        sys.exit(f"{path}: not a cloud-config (no #cloud-config line)")
    config = yaml.safe_load(text) or {}
    unknown = set(config) - SUPPORTED
    if unknown:
        sys.exit(f"{path}: keys this runner does not implement: {sorted(unknown)}")
    for entry in config.get("write_files", []):
        content = entry.get("content", "")
        data = base64.b64decode(content) if entry.get("encoding") == "b64" else content.encode()
        target = entry["path"]
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as out:
            out.write(data)
        os.chmod(target, int(str(entry.get("permissions", "0644")), 8))
        if "owner" in entry:
            user, _, group = entry["owner"].partition(":")
            os.chown(target, pwd.getpwnam(user).pw_uid, grp.getgrnam(group or user).gr_gid)
        print(f"cloud-init: wrote {target}", flush=True)
    for command in config.get("runcmd", []):
        print(f"cloud-init: running {command}", flush=True)
        status = subprocess.call(command, shell=isinstance(command, str))
        if status != 0:
            print(f"cloud-init: {command} failed with status {status}", flush=True)
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
