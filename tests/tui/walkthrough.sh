#!/usr/bin/env bash
# A new user's session, driven through tmux and read back with capture-pane:
# init a workspace, open the UI, start a tuner search on rmsnorm from the start dialog,
# watch derivations appear live, open one, approve from the queue when one is eligible,
# find the derivations in the history. Not part of pytest (it runs real evaluations).
#   bash tests/tui/walkthrough.sh [WORKDIR]      (about 1-3 minutes on CPU)
set -euo pipefail
DIR=${1:-$(mktemp -d)}
WS="$DIR/ws"
S=tik-walkthrough-$$
OUT="$DIR/walkthrough.txt"
: > "$OUT"
snap() { sleep "${2:-1}"; { echo "=== $1"; tmux capture-pane -p -t "$S"; } >> "$OUT"; }
keys() { tmux send-keys -t "$S" "$@"; }
wait_for() {  # wait_for TEXT SECONDS
  for _ in $(seq 1 "$2"); do tmux capture-pane -p -t "$S" | grep -q -- "$1" && return 0; sleep 1; done
  echo "walkthrough: timed out waiting for '$1'" | tee -a "$OUT"; return 1
}
cleanup() { tik -w "$WS" stop >/dev/null 2>&1 || true; tmux kill-session -t "$S" 2>/dev/null || true; }
trap cleanup EXIT

tik -w "$WS" init
tmux new-session -d -s "$S" -x 80 -y 24 "tik -w '$WS'; sleep 600"
wait_for "rmsnorm" 60;                snap "overview of a fresh workspace"
keys s;                               wait_for "Start a search" 10; snap "start dialog"
# operator select: open it, move to rmsnorm (all, embedding, rmsnorm), choose
keys Enter; sleep 1; keys Down; sleep 0.3; keys Down; sleep 0.3; keys Enter; sleep 1
for _ in 1 2 3; do keys Tab; sleep 0.4; done   # proposer (tuner) -> replay file -> budget
keys C-u; sleep 0.3; keys 4; sleep 0.3; snap "dialog filled in" 0.5
keys Enter;                           snap "search requested" 2
wait_for "running" 60;                snap "worker running"
keys 2;                               snap "tree while the search runs (new nodes open live)" 3
keys 1;                               wait_for "worker finished" 400 || true; snap "search finished" 1
keys 2;                               sleep 1; keys e; snap "tree after the search" 2
keys 5;                               snap "event log" 2
keys 6;                               snap "progress: time ×root of every derivation per operator" 1
keys 3;                               snap "promotion queue" 1
if tmux capture-pane -p -t "$S" | grep -q "#[0-9]"; then keys a; snap "approved" 2; fi
keys 4;                               snap "history" 1
keys /; sleep 0.3; keys t u n e r; sleep 0.3; keys Enter; snap "history filtered to tuner" 1
keys Enter;                           snap "a derivation's detail" 2
keys 2;                               snap "its diff" 1
keys 4;                               snap "its cells as heatmaps (×root against each limit, ×incumbent)" 1
keys Escape q
echo "walkthrough: screens saved in $OUT"
