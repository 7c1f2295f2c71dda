#!/bin/sh
# gpu-worker refuses bad command lines with a message naming the problem and exit status 2,
# before loading a model. $1: the gpu-worker binary.
bin=$1
. "$(dirname "$0")/../cli_expect.sh"
expect "needs --model" generate --prompt hi
expect "unknown option --bogus" generate --model m --bogus 1
expect "needs a value" generate --model m --ctx
expect "bad --threads" generate --model m --threads 0
expect "bad --mode fast" generate --model m --mode fast
expect "--mode roar needs --stores or --shard-map" generate --model m --mode roar
expect "need a --mode that uses them" generate --model m --stores 127.0.0.1:1
expect "not both" generate --model m --mode flat --stores 127.0.0.1:1 --shard-map f
expect "--index-per-kv-head is for --mode roar, not flat" generate --model m --mode flat --stores a:1 --index-per-kv-head
expect "--key-top-queries is for --mode roar, not ivf" generate --model m --mode ivf --stores a:1 --key-top-queries 4
expect "bad --key-top-queries 65" generate --model m --mode roar --stores a:1 --key-top-queries 65
expect "bad --build-layers 0 (1 to 8)" generate --model m --mode roar --stores a:1 --build-layers 0
expect "bad --build-layers 9 (1 to 8)" generate --model m --mode roar --stores a:1 --build-layers 9
expect "--synthetic-prefill fills kv-stores: it needs a --mode other than full" generate --model m --synthetic-prefill
expect "--synthetic-prefill is a generate option, not dump-qk" dump-qk --model m --mode flat --stores a:1 --synthetic-prefill
exit $fail
