#!/usr/bin/env bash
# Install the four coding CLIs at the versions pinned beside this file, into a project-local
# prefix (default .vibey/real-cli): npm packages under node_modules/, aider in a venv of its own.
# Harmless to run again: each part is redone only when its pin file is newer than the install.
# Prints the directory holding the four executables (claude, codex, gemini, aider).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prefix=${VIBEY_REAL_CLI_PREFIX:-$root/.vibey/real-cli}
mkdir -p "$prefix/bin"

if ! command -v npm >/dev/null; then
    echo "real-cli: npm is missing: apt-get install nodejs npm (Node.js 20+)" >&2
    exit 2
fi
# The npm packages and aider's venv are installed side by side: each mostly waits on its
# registry and its disk.
install_npm() {
    if [ ! -f "$prefix/.npm-installed" ] || [ "$here/package.json" -nt "$prefix/.npm-installed" ] \
        || [ "$here/package-lock.json" -nt "$prefix/.npm-installed" ]; then
        cp "$here/package.json" "$prefix/package.json"
        if [ -f "$here/package-lock.json" ] && cmp -s <(jq -S .dependencies "$here/package.json" 2>/dev/null) \
            <(jq -S '.packages[""].dependencies' "$here/package-lock.json" 2>/dev/null); then
            # The lock matches the pins: install exactly it.
            cp "$here/package-lock.json" "$prefix/package-lock.json"
            (cd "$prefix" && npm ci --no-audit --no-fund --loglevel=error >&2)
        else
            # A pin was bumped: resolve it, and keep the new lock beside the pins.
            rm -f "$prefix/package-lock.json"
            (cd "$prefix" && npm install --no-audit --no-fund --loglevel=error >&2)
            cp "$prefix/package-lock.json" "$here/package-lock.json"
        fi
        touch "$prefix/.npm-installed"
    fi
}
install_aider() {
    if [ ! -f "$prefix/.aider-installed" ] || [ "$here/aider.txt" -nt "$prefix/.aider-installed" ]; then
        [ -x "$prefix/aider-venv/bin/python" ] || python3 -m venv "$prefix/aider-venv"
        "$prefix/aider-venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/aider.txt" >&2
        touch "$prefix/.aider-installed"
    fi
}
install_npm &
npm_pid=$!
install_aider &
aider_pid=$!
failed=0
wait "$npm_pid" || failed=$?
wait "$aider_pid" || failed=$?
if [ "$failed" -ne 0 ]; then
    echo "real-cli: the install failed (exit $failed); its output is above" >&2
    exit "$failed"
fi
for cli in claude codex gemini; do
    ln -sf "$prefix/node_modules/.bin/$cli" "$prefix/bin/$cli"
done
ln -sf "$prefix/aider-venv/bin/aider" "$prefix/bin/aider"
echo "$prefix/bin"
