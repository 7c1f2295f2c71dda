#!/bin/sh
# accuracy-bench refuses bad input with a message naming the problem and exit status 2, before
# loading anything. $1: the accuracy-bench binary.
bin=$1
. "$(dirname "$0")/../cli_expect.sh"
expect "--model and --out are required" --tasks passkey
expect "unknown task" --model m --out o --tasks passkey,nope
expect "--lengths" --model m --out o --lengths 1024,abc
expect "--depths" --model m --out o --depths 0.5,1.5
expect "must start with full" --model m --out o --modes roar,full
expect "need --stores" --model m --out o --modes full,roar
expect "modes flat, ivf, kgraph, roar, wave need --stores" --model m --out o --modes full,wave
expect "not a non-negative integer" --model m --out o --top-k -3
expect "unknown mode in full,flat+retro0" --model m --out o --modes full,flat+retro0
expect "must start with full" --model m --out o --modes full+retro2,flat
expect "--fidelity-text: corpus or generated" --model m --out o --fidelity-text prose
expect "unknown option" --model m --out o --bogus 1
expect "needs a value" --model m --out o --sink
expect "goes with --report-from" --model m --out o --fidelity-from f.json
expect "needs the run's --tasks" --model m --out o --report-from s.jsonl --tasks none
"$bin" --help | grep -q "usage: accuracy-bench" || { echo "FAIL: --help"; fail=1; }
"$bin" --help | grep -q "^modes: full|streaming|flat|ivf|kgraph|roar|wave$" || { echo "FAIL: --help lists the modes"; fail=1; }
exit $fail
