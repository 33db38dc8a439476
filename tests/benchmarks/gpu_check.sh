#!/usr/bin/env bash
# Issue 14's GPU checks, sized for one short call on a lent GPU machine (offline: the models are built from config.json
# files with random weights; speed does not depend on them). WHAT picks the parts, in order:
#   nb       the `#| cuda` cells of 02_kernels with the rest of the notebook (correctness on CUDA, kernel tables)
#   bench    bench_train.py's GPU table for SmolLM2-135M, batch 16 x 1024 (tokens/s, MFU, peak memory per arm)
#   bench32  the same at batch 32 x 1024 for fp, wf_bitlinear and wf_trainer (per-step host overhead amortized over 2x the tokens)
#   qwen     the same for a Qwen3-0.6B-shaped model, batch 8 x 1024 (fp, wf_bitlinear, wf_cublas)
#   gemm     02_kernels' GPU tables alone (int8 GEMM + rescale vs bf16 and cuBLAS; quantizers), M = 16384, and the tiles chosen
#   compiled 01_quant with its `#| cuda` cells (the compiled BitLinear block on CUDA), then the GPU table at 16 x 1024 for
#            eager and compiled blocks (fp, fp_compiled, wf_bitlinear, wf_compiled, and FP and ternary through the compiled Trainer)
#   profile  torch.profiler (CPU + CUDA) of one training step of each of $PROFILE_ARMS (fp wf_bitlinear wf_trainer) on SmolLM2
#   WHAT="nb bench" bash tests/benchmarks/gpu_check.sh SMOLLM2_CONFIG_DIR [QWEN3_CONFIG_DIR]    # logs go to $OUT (or gpu_out/)
set -o pipefail
SMOL=${1:?a SmolLM2-135M config dir}; QWEN=$2; OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
B=tests/benchmarks/bench_train.py; ARMS=${ARMS:-fp,hf_autobitlinear,wf_bitlinear,wf_cublas,wf_fakequant,wf_trainer}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$OUT/gpu.txt"
for what in ${WHAT:-nb bench qwen}; do case $what in
  nb) timeout 240 python3 tests/benchmarks/run_nb.py nbs/02_kernels.ipynb --flags cuda --keep-going 2>&1 | tee "$OUT/nb_kernels.log" ;;
  bench) timeout 240 python3 $B --device cuda --config "$SMOL" --batch-size 16 --seq-len 1024 --steps 8 --warmup 3 --precisions bf16 \
           --arms "$ARMS" --repeats ${REPEATS:-1} 2>&1 | tee "$OUT/bench_smollm2.log" ;;
  bench32) timeout 150 python3 $B --device cuda --config "$SMOL" --batch-size 32 --seq-len 1024 --steps 6 --warmup 3 --precisions bf16 \
           --arms fp,wf_bitlinear,wf_trainer 2>&1 | tee "$OUT/bench_smollm2_b32.log" ;;
  qwen) [ -n "$QWEN" ] && timeout 150 python3 $B --device cuda --config "$QWEN" --batch-size 8 --seq-len 1024 --steps 6 --warmup 3 \
           --precisions bf16 --arms fp,wf_bitlinear,wf_cublas 2>&1 | tee "$OUT/bench_qwen3.log" ;;
  compiled) timeout 150 python3 tests/benchmarks/run_nb.py nbs/01_quant.ipynb --flags cuda --keep-going 2>&1 | tee "$OUT/nb_quant.log"
           timeout 300 python3 $B --device cuda --config "$SMOL" --batch-size 16 --seq-len 1024 --steps 8 --warmup 3 --precisions bf16 \
           --arms fp,fp_compiled,wf_bitlinear,wf_compiled,fp_trainer_compiled,wf_trainer_compiled 2>&1 | tee "$OUT/bench_compiled.log" ;;
  gemm) timeout 120 python3 -c "import wf_nb.kernels as k; k.int8_gemm_table(ms=(16384,)); print({str(key): str(c) for key, c in k._INT8_MM_TUNED.cache.items()})" \
           2>&1 | tee "$OUT/gemm.log" ;;
  profile) for arm in ${PROFILE_ARMS:-fp wf_bitlinear wf_trainer}; do
             timeout 100 python3 $B --device cuda --config "$SMOL" --batch-size 16 --seq-len 1024 --warmup 3 --precisions bf16 \
               --profile $arm 2>&1 | grep -v '^USDT\|^STAGE:' | tee "$OUT/profile_$arm.log"; done ;;
esac; done
exit 0
