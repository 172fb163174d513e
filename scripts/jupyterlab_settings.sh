#!/bin/bash
# JupyterLab settings for students, written into the environment at PREFIX (.venv for make, the image for repo2docker):
# no news popup, no update check.
# Usage: scripts/jupyterlab_settings.sh PREFIX
set -euo pipefail
prefix="${1:?usage: $0 PREFIX, the prefix of the environment, e.g. .venv}"
mkdir -p "$prefix/share/jupyter/lab/settings"
printf '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}\n' \
	> "$prefix/share/jupyter/lab/settings/overrides.json"
