#!/usr/bin/env python3
"""Builds the scheduler's status page into C++ at build time.

The page is edited as three files (status_page.html, .css, .js: open the HTML in a browser
beside the other two to work on it) and served as one self-contained page: the HTML's
<link rel="stylesheet" href="status_page.css"> line becomes a <style> holding the CSS, and
its <script src="status_page.js"></script> line a <script> holding the JS.

Usage: embed_status_page.py HTML CSS JS OUT.cc
OUT.cc defines paramserver::StatusPageHtml() (scheduler/status_page.h). Exits 1, naming
the file and what is wrong, when a tag is missing or a file holds what would end its
element (or the C++ string) early.
"""
import sys

LINK = '<link rel="stylesheet" href="status_page.css">\n'
SCRIPT = '<script src="status_page.js"></script>\n'
DELIMITER = "PAGE"


def fail(message):
    sys.stderr.write("embed_status_page: %s\n" % message)
    sys.exit(1)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def main(argv):
    if len(argv) != 5:
        fail("usage: embed_status_page.py HTML CSS JS OUT.cc")
    html_path, css_path, js_path, out_path = argv[1:]
    html, css, js = read(html_path), read(css_path), read(js_path)
    for path, text, tag in ((html_path, html, LINK), (html_path, html, SCRIPT)):
        if text.count(tag) != 1:
            fail("%s must hold the line %r exactly once" % (path, tag.strip()))
    if "</style" in css.lower():
        fail("%s holds '</style', which would end the page's <style> early" % css_path)
    if "</script" in js.lower():
        fail("%s holds '</script', which would end the page's <script> early" % js_path)
    for path, text in ((css_path, css), (js_path, js)):
        if not text.endswith("\n"):
            fail("%s must end with a newline" % path)
    page = html.replace(LINK, "<style>\n" + css + "</style>\n").replace(
        SCRIPT, "<script>\n" + js + "</script>\n")
    if ")%s\"" % DELIMITER in page:
        fail("the page holds ')%s\"', which would end the C++ string early" % DELIMITER)
    with open(out_path, "w", encoding="utf-8") as out:
        out.write("// Made by scheduler/status_page/embed_status_page.py from status_page.html, "
                  ".css and .js.\n")
        out.write('#include "scheduler/status_page.h"\n\nnamespace paramserver {\n\n')
        out.write("const std::string& StatusPageHtml() {\n")
        out.write('  static const std::string* const html = new std::string(R"%s(' % DELIMITER)
        out.write(page)
        out.write(')%s");\n  return *html;\n}\n\n}  // namespace paramserver\n' % DELIMITER)


if __name__ == "__main__":
    main(sys.argv)
