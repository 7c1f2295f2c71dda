#!/bin/sh
# kv-store refuses bad command lines with a message naming the flag and exit status 2, before
# it binds a port. $1: the kv-store binary.
bin=$1
. "$(dirname "$0")/../cli_expect.sh"
expect "--listen 'x' is not HOST:PORT" --listen x
expect "--threads '0' is not a number in [1, 1024]" --listen 127.0.0.1:0 --threads 0
expect "--index-threads '0' is not a number in [1, 1024]" --listen 127.0.0.1:0 --index-threads 0
expect "--index-threads 'two' is not a number in [1, 1024]" --listen 127.0.0.1:0 --index-threads two
expect "--memory-budget 'lots' is not a size like 64G or 512M" --listen 127.0.0.1:0 --memory-budget lots
"$bin" --help | grep -q -- "--index-threads N" || { echo "FAIL: --help does not list --index-threads"; fail=1; }
exit $fail
