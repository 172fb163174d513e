#!/usr/bin/env bash
# The system packages pip cannot install, and only those that are missing:
#   python3-venv          so `make` can create .venv
#   nodejs, npm           to fetch the book's JavaScript for offline reading (skipped when npm is there already:
#                         NodeSource's nodejs ships its own npm and conflicts with Debian's npm package)
#   chromium              the browser tests drive /usr/bin/chromium (Debian's package, not a snap)
#   fonts-wqy-microhei    a CJK font, so screenshots show Chinese instead of boxes
#
#   scripts/install-system-deps.sh           say what is missing, then install it with apt-get
#   scripts/install-system-deps.sh --check   only say what is missing (exit 1 if anything is)
#
# Works as root (no sudo needed) and as a user with sudo. Where apt-get is missing it says what to install instead.
# Used by .ci/run and the README's quick start.
set -euo pipefail

CHECK_ONLY=0
case "${1:-}" in
    "") ;;
    --check) CHECK_ONLY=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-system-deps: unknown option '$1' (allowed: --check, --help)" >&2; exit 2 ;;
esac

PYTHON="${PYTHON:-python3}"
CHROMIUM_PATH="${CHROMIUM_PATH:-/usr/bin/chromium}"    # where tests/browser.py looks

missing=()     # Debian package names
why=()         # one line per package, printed before installing

if ! "$PYTHON" -c "import ensurepip, venv" >/dev/null 2>&1; then
    missing+=(python3-venv); why+=("python3-venv: '$PYTHON -m venv' cannot create .venv without it")
fi
if command -v npm >/dev/null 2>&1; then
    :                                                     # any npm will do, Debian's or NodeSource's
elif command -v node >/dev/null 2>&1 || command -v nodejs >/dev/null 2>&1; then
    # A Node.js without npm. Debian's nodejs: add Debian's npm. NodeSource's nodejs provides npm itself, so npm
    # missing there means a broken install that apt cannot repair by adding npm (the two packages conflict).
    if dpkg-query -W -f='${Version}' nodejs 2>/dev/null | grep -qi nodesource; then
        echo "install-system-deps: Node.js from NodeSource is installed but npm is not on PATH;" >&2
        echo "  reinstall it (apt-get install --reinstall nodejs) rather than adding Debian's npm, which conflicts." >&2
        exit 1
    fi
    missing+=(npm); why+=("npm: Node.js is here but npm is not; the build fetches MathJax and the widget JavaScript with it")
else
    missing+=(nodejs npm); why+=("nodejs npm: the build fetches MathJax and the widget JavaScript with npm")
fi
if [ ! -x "$CHROMIUM_PATH" ]; then
    if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
        why+=("chromium: one is on PATH ($(command -v chromium || command -v chromium-browser)) but not at $CHROMIUM_PATH, where the browser tests look (a snap Chromium cannot be driven there)")
    else
        why+=("chromium: the browser tests drive $CHROMIUM_PATH")
    fi
    missing+=(chromium)
fi
if ! { fc-list 2>/dev/null | grep -qi "wenquanyi\|wqy\|Noto Sans CJK"; } \
        && ! dpkg-query -W -f='${Status}' fonts-wqy-microhei 2>/dev/null | grep -q "install ok installed"; then
    missing+=(fonts-wqy-microhei); why+=("fonts-wqy-microhei: a CJK font for the browser's screenshots (5 MB)")
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-system-deps: nothing to install (python3-venv, npm, $CHROMIUM_PATH and a CJK font are present)"
    exit 0
fi

echo "install-system-deps: will install ${missing[*]}"
for line in "${why[@]}"; do echo "  $line"; done
[ "$CHECK_ONLY" -eq 1 ] && exit 1

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: apt-get is not here (not Debian or Ubuntu). Install the equivalents yourself:" >&2
    echo "  Python's venv module, Node.js with npm, Chromium at $CHROMIUM_PATH (or a link to it), a CJK font." >&2
    exit 1
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-system-deps: not root and no sudo; run this script as root: su -c '$0'" >&2
        exit 1
    fi
    SUDO=(sudo)
fi
"${SUDO[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}"
if [ ! -x "$CHROMIUM_PATH" ]; then
    echo "install-system-deps: apt installed chromium, but $CHROMIUM_PATH is still missing (on Ubuntu the package" >&2
    echo "  is a snap). Install Debian's chromium, or link a real Chromium binary to $CHROMIUM_PATH." >&2
    exit 1
fi
echo "install-system-deps: done"
