#!/bin/sh
# kv-store refuses bad command lines and config files with a message naming the flag (and the
# file and line) and exit status 2, before it binds a port; a config file's options apply and
# the command line overrides them. $1: the kv-store binary.
bin=$1
. "$(dirname "$0")/../cli_expect.sh"
expect "bad --listen x: not HOST:PORT" --listen x
expect "bad --threads 0: must be 1 to 1024" --listen 127.0.0.1:0 --threads 0
expect "bad --index-threads 0: must be 1 to 1024" --listen 127.0.0.1:0 --index-threads 0
expect "bad --index-threads two: not an integer" --listen 127.0.0.1:0 --index-threads two
expect "bad --memory-budget lots: not a size like 64G or 512M" --listen 127.0.0.1:0 --memory-budget lots
expect "bad --max-message 512: must be 1K to 2147483647" --listen 127.0.0.1:0 --max-message 512
expect "bad --log-level loud: must be debug, info, warn or error" --listen 127.0.0.1:0 --log-level loud
expect "unknown option --bogus" --listen 127.0.0.1:0 --bogus 1
expect "--grace-ms needs a value" --listen 127.0.0.1:0 --grace-ms
expect "--listen HOST:PORT is required" --threads 2
"$bin" --help | grep -q -- "--index-threads N" || { echo "FAIL: --help does not list --index-threads"; fail=1; }
"$bin" --help | grep -q -- "--config FILE" || { echo "FAIL: --help does not list --config"; fail=1; }

dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
printf '# a store for the test\nlisten 127.0.0.1:0\n\nmemory-budget 1G\nthreads 0\n' >"$dir/bad.conf"
expect "$dir/bad.conf:5: bad threads 0: must be 1 to 1024" --config "$dir/bad.conf"
printf 'listen 127.0.0.1:0\nthreds 2\n' >"$dir/typo.conf"
expect "$dir/typo.conf:2: unknown option threds" --config "$dir/typo.conf"
printf 'config other.conf\n' >"$dir/nested.conf"
expect "$dir/nested.conf:1: config cannot be set in a config file" --config "$dir/nested.conf" --listen 127.0.0.1:0
expect "config file: cannot open $dir/none.conf" --config "$dir/none.conf" --listen 127.0.0.1:0
# a bad command line is reported even when the file is good
printf 'listen 127.0.0.1:0\n' >"$dir/ok.conf"
expect "bad --max-calls 0: must be 1 to 4096" --config "$dir/ok.conf" --max-calls 0

# The file's options are in force (listen, budget, ready file, log level) and --max-calls on the
# command line overrides the file's, whichever comes first.
cat >"$dir/kv.conf" <<CONF
# kv-store options
listen 127.0.0.1:0
memory-budget 1G
  max-calls 7
ready-file $dir/ready
log-level info
CONF
"$bin" --max-calls 9 --config "$dir/kv.conf" >"$dir/log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if [ -s "$dir/ready" ]; then
  grep -q "memory budget 1073741824 bytes, max message 67108864 bytes, 9 calls" "$dir/log" ||
    { echo "FAIL: config file / override not in force: $(cat "$dir/log")"; fail=1; }
else
  echo "FAIL: no ready file from the config's ready-file: $(cat "$dir/log")"
  fail=1
fi
kill -TERM "$pid" 2>/dev/null
wait "$pid" || { echo "FAIL: kv-store exited $? on SIGTERM"; fail=1; }
pid=
exit $fail
