#!/bin/sh
# docs/configuration.md names every option the programs' --help lists (the usage is generated
# from the option tables, so a row added without its documentation fails here, naming it).
# $1: gpu-worker, $2: kv-store, $3: docs/configuration.md.
gw=$1 kvs=$2 doc=$3
fail=0
[ -r "$doc" ] || { echo "FAIL: cannot read $doc"; exit 1; }
helps=$(mktemp)
trap 'rm -f "$helps"' EXIT
"$gw" --help >"$helps" || { echo "FAIL: gpu-worker --help exited $?"; fail=1; }
# every command's own help too: the lines between "commands:" and "options:"
for cmd in $(sed -n '/^commands:/,/^options:/s/^  \([a-z-]*\)  .*/\1/p' "$helps"); do
  "$gw" "$cmd" --help >>"$helps" || { echo "FAIL: gpu-worker $cmd --help exited $?"; fail=1; }
  n_cmds=$((${n_cmds:-0} + 1))
done
[ "${n_cmds:-0}" -ge 1 ] || { echo "FAIL: no commands found in gpu-worker --help"; fail=1; }
"$kvs" --help >>"$helps" || { echo "FAIL: kv-store --help exited $?"; fail=1; }
opts=$(grep -o -- '--[a-z][a-z0-9-]*' "$helps" | sort -u)
n=$(printf '%s\n' "$opts" | grep -c -- '^--')
[ "$n" -ge 20 ] || { echo "FAIL: only $n options found in the help output"; fail=1; }
for o in $opts; do
  grep -q -E -- "$o([^a-z0-9-]|\$)" "$doc" || { echo "FAIL: $o is not in $doc"; fail=1; }
done
[ $fail -eq 0 ] && echo "all $n options of the help output are in $doc"
exit $fail
