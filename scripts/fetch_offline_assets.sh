#!/usr/bin/env bash
# Fetch the third-party JavaScript that the book serves itself, so that pages render with the network cut off:
# MathJax 3, require.js and the ipywidgets embed manager, as npm packages, copied into the git-ignored _offline/.
# book/offline_assets.py serves that folder when it is complete; otherwise the book falls back to CDN links.
#
# Idempotent: a stamp file records what was fetched, and a second run with the same pins returns at once.
# Without npm (or without access to its registry) it warns and exits 0; the book then still builds, with CDN links.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/_offline"
STAMP="$DEST/.stamp-offline-assets"
MATHJAX="mathjax@3.2.2"
REQUIREJS="requirejs@2.3.8"
HTML_MANAGER="@jupyter-widgets/html-manager@1.0.6"
PINS="$MATHJAX $REQUIREJS $HTML_MANAGER"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$PINS" ]]; then
    echo "offline assets already in $DEST ($PINS)"
    exit 0
fi

warn() {
    echo "WARNING: $1" >&2
    echo "WARNING: the book will load MathJax, require.js and the widget manager from CDNs, so math and widgets" >&2
    echo "WARNING: need internet access in the browser. Install Node.js (npm) and run scripts/fetch_offline_assets.sh again." >&2
}

if ! command -v npm >/dev/null 2>&1; then
    warn "npm not found: cannot fetch the offline JavaScript for the book."
    exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

if ! (cd "$TMP" && npm pack --silent "$MATHJAX" "$REQUIREJS" "$HTML_MANAGER" >/dev/null); then
    warn "npm pack $PINS failed (is the npm registry reachable?)."
    exit 0
fi

for tarball in "$TMP"/*.tgz; do
    name="$(basename "$tarball" .tgz)"
    mkdir -p "$TMP/$name"
    tar -xzf "$tarball" -C "$TMP/$name"
done

OUT="$TMP/_offline"
mkdir -p "$OUT/mathjax" "$OUT/requirejs" "$OUT/widgets"
# MathJax loads fonts and TeX extensions on demand relative to tex-mml-chtml.js: keep the whole es5 tree.
cp -R "$TMP"/mathjax-*/package/es5/. "$OUT/mathjax/"
cp "$TMP"/mathjax-*/package/LICENSE "$OUT/mathjax/LICENSE"
cp "$TMP"/requirejs-*/package/require.js "$OUT/requirejs/require.js"
# embed-amd.js resolves its icon fonts relative to its own module path: the fonts sit next to it.
manager="$(echo "$TMP"/jupyter-widgets-html-manager-*/package)"
cp "$manager/dist/embed-amd.js" "$manager/LICENSE" "$OUT/widgets/"
cp "$manager"/dist/*.woff "$manager"/dist/*.woff2 "$manager"/dist/*.ttf "$manager"/dist/*.eot "$manager"/dist/*.svg \
    "$OUT/widgets/"

for required in mathjax/tex-mml-chtml.js requirejs/require.js widgets/embed-amd.js; do
    if [[ ! -f "$OUT/$required" ]]; then
        warn "the fetched packages lack $required."
        exit 0
    fi
done

echo "$PINS" > "$OUT/.stamp-offline-assets"
rm -rf "$DEST"
mv "$OUT" "$DEST"
echo "offline assets fetched into $DEST ($PINS, $(du -sh "$DEST" | cut -f1))"
