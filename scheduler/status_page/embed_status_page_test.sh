#!/usr/bin/env bash
# embed_status_page.py: the page it builds is the HTML with the CSS and JS inlined in
# place of their tags, and a file that would break the page is refused, named.
# Usage (Bazel passes these): embed_status_page_test.sh EMBED HTML CSS JS BUILT_CC
set -uo pipefail
embed=$1 html=$2 css=$3 js=$4 built=$5
source "${TEST_SRCDIR:?run by bazel test}/${TEST_WORKSPACE:-paramserver}/tests/sh_check.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The page in the binary: one self-contained page, nothing fetched but /api/status.
page=$work/page.html
sed -n '/R"PAGE(/,/)PAGE"/p' "$built" | sed -e '1s/.*R"PAGE(//' -e '${/^)PAGE"/d;s/)PAGE".*//;}' >"$page"
# What it should be, made here another way: each tag's line replaced by its file, whole.
awk -v css="$css" -v js="$js" '
  $0 == "<link rel=\"stylesheet\" href=\"status_page.css\">" {
    print "<style>"; while ((getline line < css) > 0) print line; print "</style>"; next }
  $0 == "<script src=\"status_page.js\"></script>" {
    print "<script>"; while ((getline line < js) > 0) print line; print "</script>"; next }
  { print }' "$html" >"$work/expected.html"
check "the built page is the HTML with the CSS and JS in place of their tags, byte for byte" \
  cmp "$work/expected.html" "$page"
check "the built page starts as the HTML file does" cmp <(head -n 6 "$html") <(head -n 6 "$page")
check "its <style> holds the CSS file, whole" cmp "$css" <(sed -n '/^<style>$/,/^<\/style>$/{//!p}' "$page")
check "its <script> holds the JS file, whole" cmp "$js" <(sed -n '/^<script>$/,/^<\/script>$/{//!p}' "$page")
check "it links no file" bash -c "! grep -Eq '<link|<script src=' '$page'"
check "it has one style and one script" bash -c \
  "[[ \$(grep -c '^<style>\$' '$page') == 1 && \$(grep -c '^<script>\$' '$page') == 1 ]]"
# Files that would break the page.
printf 'body { }\n</style><script>alert(1)</script>\n' >"$work/bad.css"
"$embed" "$html" "$work/bad.css" "$js" "$work/out.cc" 2>"$work/err"
check "a CSS file holding </style is refused" test $? -eq 1
check "naming the file" grep -q "bad.css holds '</style'" "$work/err"
printf 'let s = "</script>";\n' >"$work/bad.js"
"$embed" "$html" "$css" "$work/bad.js" "$work/out.cc" 2>"$work/err"
check "a JS file holding </script is refused" test $? -eq 1
grep -v 'status_page.css' "$html" >"$work/nolink.html"
"$embed" "$work/nolink.html" "$css" "$js" "$work/out.cc" 2>"$work/err"
check "an HTML file without the stylesheet's tag is refused" test $? -eq 1
check "naming the tag" grep -q 'nolink.html must hold the line .*status_page.css' "$work/err"
end_checks
