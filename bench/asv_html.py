"""Make the site written by `asv publish` render without internet.

asv 0.6's index.html loads jQuery, flot, bootstrap, stupidtable and md5 from CDNs; with no
network the page stays blank.  This fetches the same libraries from the npm registry
(`npm pack`, cached in .asv/vendor), copies them into <html_dir>/vendor/ and points
index.html at the local copies (dropping the CDN integrity attributes).

    python -m bench.asv_html [--html-dir .asv/html] [--cache .asv/vendor]

stupidtable 1.0.1 is not on npm: stupid-table-plugin 1.1.3 (the same plugin, same API)
stands in for it; flot 0.8.3 ships unminified files, used as they are.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

# (npm spec, file in the package tarball, where it goes under vendor/, CDN URL fragment it replaces)
FILES = [
    ("jquery@3.3.1", "package/dist/jquery.min.js", "jquery.min.js", "code.jquery.com/jquery-3.3.1.min.js"),
    ("flot@0.8.3", "package/jquery.flot.js", "jquery.flot.js", "flot/0.8.3/jquery.flot.min.js"),
    ("flot@0.8.3", "package/jquery.flot.time.js", "jquery.flot.time.js", "flot/0.8.3/jquery.flot.time.min.js"),
    ("flot@0.8.3", "package/jquery.flot.selection.js", "jquery.flot.selection.js", "flot/0.8.3/jquery.flot.selection.min.js"),
    ("flot@0.8.3", "package/jquery.flot.categories.js", "jquery.flot.categories.js", "flot/0.8.3/jquery.flot.categories.min.js"),
    ("flot-orderbars@1.0.0", "package/js/jquery.flot.orderBars.js", "jquery.flot.orderBars.js", "flot-orderbars@1.0.0/js/jquery.flot.orderBars.js"),
    ("stupid-table-plugin@1.1.3", "package/stupidtable.min.js", "stupidtable.min.js", "stupidtable/1.0.1/stupidtable.min.js"),
    ("blueimp-md5@2.19.0", "package/js/md5.min.js", "md5.min.js", "blueimp-md5/2.19.0/js/md5.min.js"),
    ("bootstrap@3.1.1", "package/dist/js/bootstrap.min.js", "bootstrap.min.js", "bootstrap@3.1.1/dist/js/bootstrap.min.js"),
    ("bootstrap@3.1.1", "package/dist/css/bootstrap.min.css", "css/bootstrap.min.css", "bootstrap@3.1.1/dist/css/bootstrap.min.css"),
]
# bootstrap's css refers to ../fonts/
FONTS = [("bootstrap@3.1.1", f"package/dist/fonts/glyphicons-halflings-regular.{ext}", f"fonts/glyphicons-halflings-regular.{ext}", None)
         for ext in ("eot", "svg", "ttf", "woff")]


def _pack(spec: str, tmp: str) -> str:
    try:
        proc = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", tmp],
                              capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise SystemExit("npm is needed once to fetch the asv site's JavaScript (apt-get install npm)") from None
    if proc.returncode != 0:
        raise SystemExit(f"npm pack {spec} failed: {proc.stderr.strip()[-500:]}")
    return os.path.join(tmp, proc.stdout.strip().splitlines()[-1])


def fetch(cache: str) -> str:
    """Ensure every vendored file is in cache (fetching with npm pack when missing)."""
    missing = [f for f in FILES + FONTS if not os.path.exists(os.path.join(cache, f[2]))]
    if not missing:
        return cache
    specs = sorted({f[0] for f in missing})
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            tgz = _pack(spec, tmp)
            with tarfile.open(tgz) as tar:
                for s, member, dest, _ in missing:
                    if s != spec:
                        continue
                    data = tar.extractfile(member)
                    if data is None:
                        raise SystemExit(f"{member} not found in {spec}")
                    path = os.path.join(cache, dest)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as f:
                        f.write(data.read())
    return cache


def make_offline(html_dir: str, cache: str) -> list[str]:
    """Copy the vendored files into html_dir/vendor and rewrite index.html; returns the
    URLs that were replaced.  Raises SystemExit when a CDN reference is left over."""
    fetch(cache)
    index = os.path.join(html_dir, "index.html")
    if not os.path.exists(index):
        raise SystemExit(f"{index} not found: run `asv publish` first")
    vendor = os.path.join(html_dir, "vendor")
    for _, _, dest, _ in FILES + FONTS:
        os.makedirs(os.path.dirname(os.path.join(vendor, dest)), exist_ok=True)
        shutil.copyfile(os.path.join(cache, dest), os.path.join(vendor, dest))
    with open(index, encoding="utf-8") as f:
        html = f.read()
    replaced = []
    for _, _, dest, fragment in FILES:
        pat = re.compile(r'(src|href)="https?://[^"]*' + re.escape(fragment) + r'"[^>]*?(/?>)')
        html, n = pat.subn(lambda m, d=dest: f'{m.group(1)}="vendor/{d}"{m.group(2)}', html)
        if n:
            replaced.append(fragment)
    left = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', html)
    if left:
        raise SystemExit(f"CDN references left in {index}: {left}")
    with open(index, "w", encoding="utf-8") as f:
        f.write(html)
    return replaced


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.asv_html", description=__doc__.split("\n\n")[0])
    p.add_argument("--html-dir", default=".asv/html")
    p.add_argument("--cache", default=".asv/vendor")
    a = p.parse_args(argv)
    replaced = make_offline(a.html_dir, a.cache)
    print(f"{a.html_dir}/index.html: {len(replaced)} CDN references now load from vendor/ (renders offline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
