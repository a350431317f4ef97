#!/usr/bin/env bash
# A device job longer than one call (600 s): started in the background, where it outlives its call while the
# machine stays warm (about 30 s idle), and collected by the calls after it, issued back to back in one batch.
#
#   bash lab/gpu/background.sh start NAME CMD...   # returns at once
#   bash lab/gpu/background.sh wait NAME           # waits at most WAIT_S (default 570), then returns
#
# start  copies the checkout to $HOME/bg/NAME/tree and $DATA (when set) to $HOME/bg/NAME/data: the next call's
#        copy of the checkout replaces the working tree, and drops what that call does not carry, under a running
#        job. Then runs CMD there in a session of its own (setsid: out of the call's reach), with OUT set to
#        $HOME/bg/NAME/out and DATA to the copy; its output goes to $HOME/bg/NAME/log, its exit status to
#        $HOME/bg/NAME/done when it ends.
# wait   every POLL_S (5) s packs what CMD has written under its OUT into $OUT/NAME-out.tar.aa, .ab, ... (the device
#        returns at most 8 files a call, 16 MiB each; a call cut by the session's device budget still brings back
#        the last whole set), until the job ends or WAIT_S pass; then
#        prints the log's lines written since the last wait and whether the job has ended; exit 3 when the job is
#        gone without its exit status (a machine that stops a call's every process would do that).
#
# lab/gpu/rehearsal.sh's `start STEP` / `wait STEP` and the promises' panel (lab/gpu/README.md) run through it.
set -uo pipefail
: "${OUT:?run on the device: \$OUT is where results go}"
what=${1:-} name=${2:-}
case $what in start | wait) ;; *) echo "background.sh: usage: background.sh start NAME CMD... | wait NAME" >&2; exit 2 ;; esac
[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "background.sh $what: NAME is letters, digits, '.', '_' or '-', not '$name'" >&2; exit 2; }
bg=$HOME/bg/$name

if [ "$what" = start ]; then
  shift 2
  [ $# -gt 0 ] || { echo "background.sh start $name: no command to run" >&2; exit 2; }
  if [ ! -f "$bg/done" ] && kill -0 "$(cat "$bg/pid" 2>/dev/null)" 2>/dev/null; then  # a job gone is started anew
    echo "background.sh start $name: still running (background.sh wait $name)" >&2
    exit 2
  fi
  rm -rf "$bg"
  mkdir -p "$bg/tree" "$bg/out"
  # a file another job changes while it is read makes tar exit 1 (reports/, written by the smokes, left out): the
  # copy is judged by what arrived
  tar -cf - --exclude=./.git --exclude=./.nox --exclude=./.gpu --exclude=./reports . 2>/dev/null | tar -xf - -C "$bg/tree"
  [ -f "$bg/tree/lab/gpu/background.sh" ] || { echo "background.sh start $name: the checkout did not copy to $bg/tree" >&2; exit 1; }
  data=
  if [ -n "${DATA:-}" ]; then
    cp -a "$DATA" "$bg/data" || { echo "background.sh start $name: could not copy DATA=$DATA" >&2; exit 1; }
    data=$bg/data
  fi
  : >"$bg/log"  # before the job starts: a wait in the same breath finds it
  # every descriptor of the call let go (a job holding the call's output would hold the call until it ended)
  (cd "$bg/tree" && OUT=$bg/out DATA=$data exec setsid nohup bash -c '"$@" >"$0/log" 2>&1; echo $? >"$0/done"' \
    "$bg" "$@") </dev/null >/dev/null 2>&1 &
  echo $! >"$bg/pid"  # the job's own shell (exec all the way down: setsid does not fork outside a group leader)
  echo "$name: started in the background from $bg/tree; collect with: background.sh wait $name"
  exit 0
fi

[ -f "$bg/log" ] || { echo "background.sh wait: $name was not started on this machine (background.sh start $name CMD...)" >&2; exit 2; }
# The device brings back at most 8 files a call, 16 MiB each (the 2026-12-02 panel lost 5 of 20 pairs' archives to
# that count): what the job wrote goes back as one tar cut into 15-MiB parts, NAME-out.tar.aa, .ab, ... (at most 7;
# here: cat NAME-out.tar.* | tar -x), remade as files arrive, the parts moved in whole.
sync_out() {
  local stamp tmp=$OUT/.$name-parts
  stamp=$(cd "$bg/out" && find . -type f -printf '%P %s %T@\n' | sort | md5sum)
  [ "$stamp" = "$(cat "$bg/stamp" 2>/dev/null)" ] && return 0
  rm -rf "$tmp" && mkdir -p "$tmp" || return 1
  tar -C "$bg/out" -cf - . | split -b 15M - "$tmp/$name-out.tar." || return 1
  rm -f "$OUT/$name-out.tar."* && mv "$tmp"/* "$OUT"/ && rmdir "$tmp" && echo "$stamp" >"$bg/stamp"
}
rm -f "$bg/stamp"  # this call's $OUT starts empty
end=$((SECONDS + ${WAIT_S:-570}))
alive() { [ -f "$bg/done" ] || kill -0 "$(cat "$bg/pid")" 2>/dev/null; }
while [ ! -f "$bg/done" ] && [ "$SECONDS" -lt "$end" ] && alive; do sync_out; sleep "${POLL_S:-5}"; done
sync_out
seen=$(cat "$bg/seen" 2>/dev/null || echo 0)
tail -n +"$((seen + 1))" "$bg/log"
wc -l <"$bg/log" >"$bg/seen"
cp "$bg/log" "$OUT/$name.log"
if [ -f "$bg/done" ]; then
  echo "$name: ended, exit $(cat "$bg/done")"
elif ! alive; then
  echo "$name: gone without an exit status (killed, with the call that started it?); start it again"
  exit 3
else
  echo "$name: still running after ${WAIT_S:-570} s; call wait again"
fi
exit 0
