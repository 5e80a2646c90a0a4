#!/usr/bin/env bash
# Prompt-lookup speedup, end to end (issue #9): `sala generate` greedy on a repetitive long document,
# plain against `--speculative lookup` (fixed K, and adaptive K), the same max tokens, and a table of
# tokens generated, decode tok/s, acceptance, tokens per verify step, drafting time, speedup over
# plain, and whether the text is identical to the plain run. Run from the repository root:
#   scripts/lookup_bench.sh                              # CPU, built-in default model (random, small)
#   scripts/lookup_bench.sh --backend cuda --model DIR   # GPU machine
#   scripts/lookup_bench.sh --file doc.txt --tokens 512 --draft-tokens 4,8 --reps 3 --deterministic
# Options: --model DIR|default, --backend cpu|cuda|auto, --file FILE (the document; default: a
# paragraph repeated to about --prompt-tokens tokens), --prompt-tokens N (2000), --tokens N (256,
# tokens generated), --draft-tokens LIST (4,8: one fixed-K run each), --no-adaptive (skip the
# adaptive run, K up to the largest of the list), --reps R (3: runs per row, median decode rate),
# -t/--threads N, --deterministic (CPU batch-invariant numerics: exact identity on any CPU).
# Environment: SALA (binary; default build/sala), OUT (work files; default a temporary directory).
# Random-weight models fall into repeating loops under greedy decoding, which lookup then drafts
# from: the acceptance measured on them says how lookup behaves on repetitive text, not on a real
# model's text.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SALA=${SALA:-$ROOT/build/sala}
model=default backend=cpu file="" prompt_tokens=2000 tokens=256 drafts=4,8 adaptive=1 reps=3 threads="" det=""
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while (($#)); do
  case $1 in
    --model) model=$2; shift ;;
    --backend) backend=$2; shift ;;
    --file) file=$2; shift ;;
    --prompt-tokens) prompt_tokens=$2; shift ;;
    --tokens) tokens=$2; shift ;;
    --draft-tokens) drafts=$2; shift ;;
    --no-adaptive) adaptive=0 ;;
    --reps) reps=$2; shift ;;
    -t | --threads) threads=$2; shift ;;
    --deterministic) det=--deterministic ;;
    -h | --help) usage ;;
    *) echo "lookup_bench.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
[ -x "$SALA" ] || { echo "lookup_bench.sh: no sala binary at '$SALA' (build it or set SALA)" >&2; exit 1; }
if [ -n "${OUT:-}" ]; then
  work=$OUT
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi

# The model directory (the built-in default model is created on first use; its path is printed).
if [ "$model" = default ]; then
  model=$("$SALA" generate default "hi" -n 1 --temperature 0 --backend cpu 2>&1 >/dev/null |
    sed -n 's/^using the built-in default model: .* at //p' | tail -1)
  [ -d "$model" ] || { echo "lookup_bench.sh: could not locate the built-in default model" >&2; exit 1; }
fi

# The document: a file, or a paragraph repeated to about --prompt-tokens tokens.
count() { "$SALA" tokenize "$model" "$(cat "$1")" --no-special | wc -w; }
if [ -n "$file" ]; then
  cp "$file" "$work/doc.txt"
else
  cat >"$work/para.txt" <<'EOF'
The committee met on Tuesday to review the quarterly report. Revenue grew in every region except the
north, where two stores closed for renovation. The board asked the finance team to prepare a forecast
for the next quarter, including the cost of the new warehouse and the expected savings from the
shipping contract. Questions about the report should be sent to the operations office before Friday.
EOF
  per=$(count "$work/para.txt")
  n=$(((prompt_tokens + per - 1) / per))
  : >"$work/doc.txt"
  for ((i = 0; i < n; i++)); do cat "$work/para.txt" >>"$work/doc.txt"; done
fi
doc_tokens=$(count "$work/doc.txt")
ctx=$((doc_tokens + tokens + 64))

common=(--raw --temperature 0 -n "$tokens" --ignore-eos --no-stream -c "$ctx" --backend "$backend")
[ -n "$threads" ] && common+=(-t "$threads")
[ -n "$det" ] && common+=("$det")

# One configuration, --reps times: the median decode rate; the statistics of the last run.
run() {
  local name=$1
  shift
  local rates=()
  for ((r = 0; r < reps; r++)); do
    "$SALA" generate "$model" - "${common[@]}" "$@" <"$work/doc.txt" >"$work/$name.out" 2>"$work/$name.err" ||
      { echo "lookup_bench.sh: $name failed: $(tail -3 "$work/$name.err")" >&2; exit 1; }
    rates+=("$(sed -n 's/.*decode [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' "$work/$name.err")")
  done
  printf '%s\n' "${rates[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}' >"$work/$name.rate"
}

names=(plain)
run plain
IFS=, read -ra ks <<<"$drafts"
kmax=1
for k in "${ks[@]}"; do
  run "lookup-k$k" --speculative lookup --draft-tokens "$k"
  names+=("lookup-k$k")
  ((k > kmax)) && kmax=$k
done
if ((adaptive)); then
  run "lookup-adaptive" --speculative lookup --draft-tokens "$kmax" --adaptive-draft
  names+=("lookup-adaptive")
fi

plain_rate=$(cat "$work/plain.rate")
echo "document: $doc_tokens tokens$([ -n "$file" ] && echo " ($file)" || echo " (a $per-token paragraph x $n)"); model: $model; backend: $backend${det:+ (--deterministic)}"
echo "generate: ${common[*]} (median decode rate of $reps runs)"
echo
echo "| run | tokens generated | decode tok/s | acceptance | tokens / verify step | verify steps | draft s | speedup | output identical |"
echo "|---|---|---|---|---|---|---|---|---|"
for name in "${names[@]}"; do
  err=$work/$name.err
  gen=$(sed -n 's/.*generated \([0-9]*\) tokens.*/\1/p' "$err")
  rate=$(cat "$work/$name.rate")
  acc=- tpv=- steps=- dsec=- label=$name
  if line=$(grep '^speculative ' "$err"); then
    acc=$(sed -n 's/.*acceptance \([0-9.]*%\) (\([0-9]*\/[0-9]*\) drafts).*/\1 (\2)/p' <<<"$line")
    tpv=$(sed -n 's/.*, \([0-9.]*\) tokens per verify step.*/\1/p' <<<"$line")
    steps=$(sed -n 's/.*: \([0-9]*\) verify steps.*/\1/p' <<<"$line")
    dsec=$(sed -n 's/.*| draft \([0-9.]*\) s.*/\1/p' <<<"$line")
    label=$(sed -n 's/^speculative \(lookup ([^)]*)\).*/\1/p' <<<"$line")
  fi
  speed=$(awk -v a="$rate" -v b="$plain_rate" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')
  same=yes
  cmp -s "$work/plain.out" "$work/$name.out" || same=NO
  echo "| $label | $gen | $rate | $acc | $tpv | $steps | $dsec | $speed | $same |"
done
