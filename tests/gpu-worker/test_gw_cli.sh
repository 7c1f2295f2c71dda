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
expect "bad --build-layers 0: must be 1 to 8" generate --model m --mode roar --stores a:1 --build-layers 0
expect "bad --build-layers 9: must be 1 to 8" generate --model m --mode roar --stores a:1 --build-layers 9
expect "--mode wave needs --stores or --shard-map" generate --model m --mode wave
expect "--retrieve is for --mode wave, not flat" generate --model m --mode flat --stores a:1 --retrieve 0.1
expect "--estimate is for --mode wave, not roar" generate --model m --mode roar --stores a:1 --estimate 0.2
expect "--wave-block is for --mode wave, not full" generate --model m --wave-block 64
expect "--wave-segment is for --mode wave, not streaming" generate --model m --mode streaming --wave-segment 64
expect "bad --retrieve -1: not a fraction in [0, 1] or a token count" generate --model m --mode wave --stores a:1 --retrieve -1
expect "bad --retrieve abc: not a fraction" generate --model m --mode wave --stores a:1 --retrieve abc
expect "bad --retrieve-min -1: must be 0 to" generate --model m --mode wave --stores a:1 --retrieve-min -1
expect "--retrieve-min is for --mode wave, not roar" generate --model m --mode roar --stores a:1 --retrieve-min 64
expect "bad --estimate 2.5: above 1 it is a token count: a whole number" generate --model m --mode wave --stores a:1 --estimate 2.5
expect "bad --wave-cluster 0: must be 1 to" generate --model m --mode wave --stores a:1 --wave-cluster 0
expect "bad --wave-iters 0: must be 1 to 1000" generate --model m --mode wave --stores a:1 --wave-iters 0
expect "a growth block of 32 rows is smaller than a cluster (64)" generate --model m --mode wave --stores a:1 --wave-cluster 64 --wave-block 32
expect "a segment of 8 rows is smaller than a cluster (16)" generate --model m --mode wave --stores a:1 --wave-segment 8
expect "--synthetic-prefill fills kv-stores: it needs a --mode other than full" generate --model m --synthetic-prefill
expect "--synthetic-prefill is a generate option, not dump-qk" dump-qk --model m --synthetic-prefill
expect "--mode is a generate/serve option, not dump-qk" dump-qk --model m --mode flat
expect "--max-new-tokens is a generate option, not tokenize" tokenize --model m --max-new-tokens 4
expect "--out is a dump-qk/logits option, not generate" generate --model m --out x
expect "--threads is a generate/dump-qk/logits/info/serve option, not tokenize" tokenize --model m --threads 2
expect "--listen is a serve option, not generate" generate --model m --listen 127.0.0.1:0
expect "--max-seqs is a serve option, not generate" generate --model m --max-seqs 4
expect "bad --window 0: must be 1 to 1048576" generate --model m --mode roar --stores a:1 --window 0
expect "bad --sink -1: must be 0 to 1048576" generate --model m --sink -1
expect "bad --ctx 1e3: not an integer" generate --model m --ctx 1e3
expect "bad --top-p 0: must be > 0 and <= 1" generate --model m --top-p 0
expect "bad --temperature -1: must be >= 0" generate --model m --temperature -1
expect "bad --dtype bf16: must be f32 or f16" dump-qk --model m --dtype bf16
expect "bad --kv-dtype f8: must be f32, f16 or bf16" generate --model m --kv-dtype f8
expect "bad --kv-dtype int8: must be f32, f16 or bf16" generate --model m --kv-dtype int8 # a store dtype only
expect "bad --store-dtype i4: must be f32, f16, bf16 or int8" generate --model m --store-dtype i4
expect "bad --mode fast: not one of full|streaming|flat|ivf|kgraph|roar|wave" generate --model m --mode fast
expect "unexpected argument 'stray'" generate --model m stray
expect "unknown command 'bogus'" bogus --model m
# --help: the command's options on stdout, exit 0, defaults read from the defaults in force (the
# offload's from the offload runtime)
help=$("$bin" generate --help) || { echo "FAIL: generate --help exited $?"; fail=1; }
for want in "--window N " "latest tokens kept on the device (default 512)" "(default 128)" \
    "--store-dtype f32|f16|bf16|int8" "(default f16)" "--mode full|streaming|flat|ivf|kgraph|roar|wave" \
    "--retrieve X " "(default 0.018)" "(default 0.232)" "--wave-block N "; do
  case "$help" in *"$want"*) ;; *) echo "FAIL: '$want' not in generate --help"; fail=1 ;; esac
done
case "$help" in *"--decode-tokens"*) echo "FAIL: generate --help lists a dump-qk option"; fail=1 ;; esac
"$bin" --help | grep -q -- "--decode-tokens N" || { echo "FAIL: --help does not list every command's options"; fail=1; }
exit $fail
