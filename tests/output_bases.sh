# The output bases of the sanitizer and fuzzer builds, sourced by tests/sanitize.sh and
# tests/fuzz.sh (which share the ASan+UBSan one). One per clone, named after its path: a
# Bazel output base reused from another folder keeps runfiles links into that folder, and
# a second clone's tests then run the first one's files, or none once it is gone. The
# disk cache (.bazelrc) is shared, so a new clone's build comes mostly from it.
# REQUIRES: ROOT, the clone's root.
workspace_key=$(printf '%s' "$ROOT" | md5sum | cut -c1-12)
SANITIZE_OUTPUT_BASE="$HOME/.cache/paramserver-sanitize-output-base/$workspace_key"
TSAN_OUTPUT_BASE="$HOME/.cache/paramserver-tsan-output-base/$workspace_key"
