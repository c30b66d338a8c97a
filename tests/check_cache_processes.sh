#!/bin/bash
# Many processes on one kernel cache directory (issue 16, item 3), without a GPU: each scenario runs
# twell_cache_stress processes (tests/cache/cache_stress.cpp: KernelCache with a compile callback that
# sleeps, logs "start <pid> <key>" per compile and checks the bytes it gets) and checks counts and bytes.
#   concurrent  16 processes started together on an empty directory ask the same 4 keys: exactly one
#               compile per key across all 16, every process gets the right bytes
#   killed      a process SIGKILLed mid-compile, then a new one: it finishes in the normal time
#   damaged     truncated, garbage and mismatched (another key's) entries: `twellc cache verify` names them,
#               the next process recompiles exactly those, verify --fix removes damage
#   cap         8 concurrent writers of distinct keys under $TWELL_CACHE_MAX_BYTES: the cap holds, entries
#               were evicted, no temporaries, one lock file per entry
#   stopped     beside a lock holder stopped with SIGSTOP, a new process finishes in bounded time
#               ($TWELL_CACHE_LOCK_TIMEOUT_S=2) saying what it waited for; the holder, continued, publishes
# usage: check_cache_processes.sh SCENARIO TWELL_CACHE_STRESS TWELLC
set -u
scenario=${1:?usage: check_cache_processes.sh SCENARIO TWELL_CACHE_STRESS TWELLC}
stress=${2:?usage: check_cache_processes.sh SCENARIO TWELL_CACHE_STRESS TWELLC}
twellc=${3:?usage: check_cache_processes.sh SCENARIO TWELL_CACHE_STRESS TWELLC}
work=$(mktemp -d "${TMPDIR:-/tmp}/twell-cache-processes.XXXXXX") || exit 1
dir=$work/cache
log=$work/compiles.log
pids=""
cleanup() {
  for p in $pids; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
unset TWELL_CACHE_MAX_BYTES TWELL_CACHE_LOCK_TIMEOUT_S

fail() {
  echo "FAIL ($scenario): $*"
  for f in "$work"/out.* "$work"/err.*; do [ -s "$f" ] && { echo "--- $f"; cat "$f"; }; done
  [ -s "$log" ] && { echo "--- compile log"; cat "$log"; }
  exit 1
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
# compiles KEY: how many compile callbacks started for the key, across all processes.
compiles() { grep -c " $1\$" "$log" 2>/dev/null || true; }
# total FIELD FILES...: the sum of a field of the processes' "stress:" lines.
total() {
  field=$1; shift
  cat "$@" | awk -v f="$field" '{ for (i = 1; i < NF; ++i) if ($i == f) s += $(i + 1) } END { print s + 0 }'
}
# waits until the compile log has a line for KEY (a process is inside its compile), at most 20 s.
wait_compiling() {
  for _ in $(seq 2000); do
    [ "$(compiles "$1")" -ge 1 ] && return 0
    sleep 0.01
  done
  fail "no process started compiling $1 within 20 s"
}
entry_bytes() { find "$dir" -maxdepth 1 -name '*.twk' -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }
count() { find "$dir" -maxdepth 1 -name "$1" | wc -l; }

case $scenario in
concurrent)
  for i in $(seq 16); do
    "$stress" --dir "$dir" --keys 4 --compile-ms 200 --bytes 100000 --log "$log" --start-file "$work/go" \
      >"$work/out.$i" 2>"$work/err.$i" &
    pids="$pids $!"
  done
  touch "$work/go"
  i=0
  for p in $pids; do
    i=$((i + 1))
    wait "$p" || fail "process $i exited with status $? (1: wrong bytes)"
  done
  pids=""
  for k in 0 1 2 3; do
    [ "$(compiles stress$k)" = 1 ] || fail "stress$k compiled $(compiles stress$k) times across 16 processes, expected once"
  done
  [ "$(wc -l <"$log")" = 4 ] || fail "$(wc -l <"$log") compiles in all, expected 4"
  [ "$(total miss "$work"/out.*)" = 4 ] || fail "$(total miss "$work"/out.*) misses in all, expected 4"
  [ "$(total disk "$work"/out.*)" = 60 ] || fail "$(total disk "$work"/out.*) disk hits in all, expected 60 (16 x 4 - 4)"
  [ "$(count '*.twk')" = 4 ] || fail "$(count '*.twk') entries on disk, expected 4"
  [ "$(count '*.tmp')" = 0 ] || fail "temporaries left: $(ls -A "$dir")"
  echo "concurrent: 16 processes, 4 keys: 4 compiles in all, 60 disk hits, every process got the right bytes"
  ;;

killed)
  "$stress" --dir "$dir" --keys 1 --compile-ms 30000 --log "$log" >"$work/out.killed" 2>&1 &
  victim=$!
  pids=$victim
  wait_compiling stress0
  kill -KILL "$victim"
  wait "$victim" 2>/dev/null
  pids=""
  t0=$(now_ms)
  "$stress" --dir "$dir" --keys 1 --compile-ms 200 --log "$log" >"$work/out.after" 2>"$work/err.after" ||
    fail "the process after the killed one exited with status $?"
  elapsed=$(( $(now_ms) - t0 ))
  [ "$elapsed" -lt 5000 ] || fail "the process after the killed one took $elapsed ms (compile 200 ms), expected < 5000"
  [ "$(compiles stress0)" = 2 ] || fail "stress0 compiled $(compiles stress0) times, expected 2 (killed, then again)"
  [ "$(total miss "$work/out.after")" = 1 ] || fail "expected the new process to compile stress0 once"
  grep -q "waiting for the lock" "$work/err.after" && fail "the new process waited on the dead process's lock"
  [ "$(count '*.twk')" = 1 ] || fail "expected stress0 published"
  echo "killed: a process SIGKILLed mid-compile, the next one finished in $elapsed ms"
  ;;

damaged)
  "$stress" --dir "$dir" --keys 5 --compile-ms 0 --bytes 60000 --log "$log" >"$work/out.fill" 2>&1 ||
    fail "filling the cache failed"
  truncate -s 30000 "$dir/stress0.twk"
  head -c 60000 /dev/urandom >"$dir/stress1.twk"
  cp "$dir/stress4.twk" "$dir/stress2.twk"  # stress4's entry under stress2's name
  "$twellc" cache verify --dir "$dir" >"$work/out.verify" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "twellc cache verify exited with $rc on 3 damaged entries, expected 1"
  for k in 0 1 2; do grep -q "damaged .*stress$k.twk" "$work/out.verify" || fail "verify did not name stress$k"; done
  grep -q "stress[34].twk" "$work/out.verify" && fail "verify named a valid entry"
  grep -q "belongs to another key" "$work/out.verify" || fail "verify did not say stress2 is another key's entry"
  : >"$log"
  "$stress" --dir "$dir" --keys 5 --compile-ms 0 --bytes 60000 --log "$log" >"$work/out.again" 2>"$work/err.again" ||
    fail "the process on the damaged cache exited with status $? (1: wrong bytes)"
  for k in 0 1 2; do [ "$(compiles stress$k)" = 1 ] || fail "damaged stress$k compiled $(compiles stress$k) times, expected 1"; done
  for k in 3 4; do [ "$(compiles stress$k)" = 0 ] || fail "valid stress$k was recompiled"; done
  [ "$(total corrupt "$work/out.again")" = 3 ] || fail "$(total corrupt "$work/out.again") corrupt entries counted, expected 3"
  "$twellc" cache verify --dir "$dir" >"$work/out.verify2" 2>&1 || fail "verify after the recompiles exited with $?"
  echo garbage >"$dir/stress3.twk"
  "$twellc" cache verify --dir "$dir" --fix >"$work/out.fix" 2>&1 || fail "verify --fix exited with $?"
  [ -e "$dir/stress3.twk" ] && fail "verify --fix left the damaged stress3"
  [ "$(count '*.twk')" = 4 ] || fail "verify --fix removed more than the damaged entry"
  echo "damaged: truncated, garbage and mismatched entries reported by verify and recompiled once each"
  ;;

cap)
  # Entries of 20048 bytes; the cap holds 5 of them. 8 writers x 6 keys = 48 distinct keys.
  export TWELL_CACHE_MAX_BYTES=105000
  for i in $(seq 0 7); do
    "$stress" --dir "$dir" --keys 6 --first $((i * 6)) --compile-ms 30 --bytes 20000 --log "$log" \
      --start-file "$work/go" >"$work/out.$i" 2>"$work/err.$i" &
    pids="$pids $!"
  done
  touch "$work/go"
  for p in $pids; do wait "$p" || fail "a writer exited with status $?"; done
  pids=""
  bytes=$(entry_bytes)
  [ "$bytes" -le 105000 ] || fail "entries take $bytes bytes, above the cap of 105000: $(ls -l "$dir")"
  [ "$(count '*.twk')" -ge 1 ] || fail "no entry left"
  [ "$(total miss "$work"/out.*)" = 48 ] || fail "$(total miss "$work"/out.*) compiles, expected 48"
  [ "$(total evicted "$work"/out.*)" = $((48 - $(count "*.twk"))) ] || fail "$(total evicted "$work"/out.*) evictions for $(count "*.twk") entries left of 48"
  [ "$(count '*.tmp')" = 0 ] || fail "temporaries left"
  [ "$(count '*.lock')" = "$(count '*.twk')" ] || fail "$(count '*.lock') lock files for $(count '*.twk') entries"
  echo "cap: 8 writers, 48 keys: $(count '*.twk') entries, $bytes bytes <= 105000, $(total evicted "$work"/out.*) evictions"
  ;;

stopped)
  "$stress" --dir "$dir" --keys 1 --compile-ms 2500 --log "$log" >"$work/out.stopped" 2>"$work/err.stopped" &
  holder=$!
  pids=$holder
  wait_compiling stress0
  kill -STOP "$holder"
  t0=$(now_ms)
  TWELL_CACHE_LOCK_TIMEOUT_S=2 "$stress" --dir "$dir" --keys 1 --compile-ms 200 --log "$log" \
    >"$work/out.waiter" 2>"$work/err.waiter" || fail "the process beside the stopped holder exited with status $?"
  elapsed=$(( $(now_ms) - t0 ))
  [ "$elapsed" -ge 2000 ] || fail "finished in $elapsed ms without waiting for the lock"
  [ "$elapsed" -lt 10000 ] || fail "took $elapsed ms beside a stopped holder with a 2 s lock timeout"
  [ "$(grep -c "waiting for the lock .*stress0.lock" "$work/err.waiter")" = 1 ] || fail "no single message saying what it waited for"
  grep -q "still held after 2.0 s" "$work/err.waiter" || fail "no warning about the timeout"
  [ "$(total lock_timeouts "$work/out.waiter")" = 1 ] || fail "the lock timeout was not counted"
  [ -e "$dir/stress0.twk" ] && fail "published without the lock"
  kill -CONT "$holder"
  wait "$holder" || fail "the continued holder exited with status $?"
  pids=""
  [ "$(compiles stress0)" = 2 ] || fail "stress0 compiled $(compiles stress0) times, expected 2"
  "$stress" --dir "$dir" --keys 1 --compile-ms 0 --log "$log" >"$work/out.last" 2>&1 || fail "the last process failed"
  [ "$(total disk "$work/out.last")" = 1 ] || fail "the continued holder's entry was not published"
  echo "stopped: beside a stopped lock holder, a new process finished in $elapsed ms with a message"
  ;;

*)
  echo "check_cache_processes.sh: unknown scenario '$scenario' (concurrent, killed, damaged, cap, stopped)"
  exit 2
  ;;
esac
