#!/bin/bash
# Issue 33's side-by-side at one student-token budget, one process at a time (1 thread, nice 19), resumable:
# rerun the same command and it continues (the teacher corpus by part, wf runs by fingerprint, finished arms by JSON).
#   bash tests/benchmarks/exp_generality.sh [OUT=/tmp/runs33] [TOKENS=153600]
# Needs: sudo apt-get install dict-gcide dict-jargon fortunes bible-kjv; pip install --no-deps chatterbot-corpus
set -e
OUT=${1:-/tmp/runs33}; TOKENS=${2:-153600}
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
# the teacher's own corpus (LLM-QAT data), where the `teacher` data source reads it (wf_nb.corpora.teacher_dir)
nice -n 19 wf data generate --teacher smollm2_135m --tokens 80000
cd tests/benchmarks
nice -n 19 python bench_quality.py --parallel 1 --threads 1 --eval-tokens 8000 --out "$OUT/bench" --tokens "$TOKENS" \
  --arms fp,wf_pipeline@general,kd_peer@general@1e-3,wf_pipeline@teacher,wf_pipeline@general_teacher,wf_pipeline,kd_peer@general@5e-4,kd_peer@shakespeare@1e-3
