#!/usr/bin/env bash
# `make run` from nothing, as a newcomer gets it: a clean clone of this repository's HEAD in a
# sibling folder (so ../shared resolves as in CI), no .venv, no data/; prints the wall-clock
# seconds, the console's line count and the EM lines. The console is kept in <clone>/make-run.log.
#   bash benchmarks/make_run.sh [CLONE_DIR]      # default ../agentr1-make-run (replaced if it exists)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
clone="${1:-$repo/../agentr1-make-run}"
if [[ -e "$clone" && ! -e "$clone/.agentr1-make-run" ]]; then
  echo "$clone exists and was not made by this script: give another folder" >&2; exit 2
fi
rm -rf "$clone"
git clone -q "$repo" "$clone"
touch "$clone/.agentr1-make-run"
cd "$clone"
echo "commit $(git rev-parse HEAD), uv cache: ${UV_CACHE_DIR:-default}"
start=$(date +%s.%N)
make run > make-run.log 2>&1 || { echo "make run failed: $clone/make-run.log" >&2; exit 1; }
end=$(date +%s.%N)
echo "make run: $(echo "$end - $start" | bc) s wall clock, $(wc -l < make-run.log) console lines"
grep -A2 "^Exact match on test" make-run.log
