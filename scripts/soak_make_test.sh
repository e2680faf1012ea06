#!/usr/bin/env bash
# `make test` N times in a row in a fresh clone of this repository, with a CPU-heavy process
# beside it: a small crate (regex, serde, syn, tokio) cleaned and rebuilt with -j2 in a loop.
# Appends one line per run to $OUT and stops at the first failure; each run's log is kept
# beside it. Usage: scripts/soak_make_test.sh [N=20]  (WORK=/tmp/soak-make-test by default)
# KEEP_CLONE=1 keeps an earlier soak's clone and its target/: it fetches this repository and
# checks out its HEAD there (clean, no local changes) instead of cloning and building cold.
set -uo pipefail
N=${1:-20}
WORK=${WORK:-/tmp/soak-make-test}
OUT=${OUT:-$WORK/runs.txt}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$WORK"
rm -rf "$WORK/load"
if [ "${KEEP_CLONE:-0}" = 1 ] && [ -d "$WORK/clone/.git" ]; then
  git -C "$WORK/clone" fetch -q "$REPO" HEAD
  git -C "$WORK/clone" checkout -q --detach FETCH_HEAD
  git -C "$WORK/clone" status --porcelain | grep -q . && { echo "the kept clone has local changes" >&2; exit 2; }
  HOW="in the kept clone (fetched and checked out; target/ kept)"
else
  rm -rf "$WORK/clone"
  git clone -q "$REPO" "$WORK/clone"
  HOW="in a fresh clone"
fi
cargo new -q "$WORK/load"
cat >> "$WORK/load/Cargo.toml" <<'DEPS'
regex = "1"
serde = { version = "1", features = ["derive"] }
serde_json = "1"
syn = { version = "2", features = ["full", "extra-traits", "visit", "fold"] }
tokio = { version = "1", features = ["full"] }
DEPS
# Its own process group, so that the build running at exit stops with the loop.
setsid bash -c 'cd "$1" && while true; do cargo clean -q; cargo build -q --release -j2 >/dev/null 2>&1; done' _ "$WORK/load" &
LOAD=$!
trap 'kill -- -$LOAD 2>/dev/null' EXIT
cd "$WORK/clone"
echo "soak of $(git log --oneline -1 | cut -c1-7) $HOW, started $(date -u +%FT%TZ)" >> "$OUT"
for i in $(seq 1 "$N"); do
  s=$(date +%s); l=$(cut -d' ' -f1 /proc/loadavg)
  make test > "$WORK/run$i.log" 2>&1
  rc=$?
  counts=$(grep -E "test result" "$WORK/run$i.log" | awk '{p+=$4; f+=$6} END {print p" passed, "f" failed"}')
  echo "run $i: rc=$rc, $(( $(date +%s) - s )) s, $counts, load $l at start, $(cut -d' ' -f1 /proc/loadavg) at end" >> "$OUT"
  [ "$rc" -ne 0 ] && exit 1
done
