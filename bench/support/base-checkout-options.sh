#!/bin/bash
# A base's checkout (src/git/base.rs: `git init`, the repository's objects as alternates, HEAD at
# the commit, `reset --hard`) with git's defaults and with the `-c` options that could speed it
# up, interleaved n times; prints each option's runs sorted (ms). docs/benchmarks.md, issue 37.
#   bench/support/base-checkout-options.sh <repository> <n>   (the base is made in /dev/shm/bb/co)
set -e
R=$1; N=$2; C=$(git -C $R rev-parse HEAD); OBJ=$(git -C $R rev-parse --path-format=absolute --git-common-dir)/objects
B=/dev/shm/bb/co
declare -A sum
opts=("" "-c checkout.workers=0" "-c index.threads=true -c index.version=4" "-c checkout.workers=0 -c index.threads=true")
for i in $(seq $N); do for k in "${!opts[@]}"; do
  rm -rf $B; git init -q $B; echo $OBJ > $B/.git/objects/info/alternates; git -C $B update-ref HEAD $C
  s=$(date +%s%N); git -C $B ${opts[$k]} reset --hard --quiet; e=$(date +%s%N)
  echo "$k $(( (e-s)/1000000 ))"
done; done | sort -n -k1 -k2 | awk '{a[$1]=a[$1]" "$2} END {for (k in a) print k": "a[k]}'
for k in "${!opts[@]}"; do echo "$k = ${opts[$k]}"; done
rm -rf $B
