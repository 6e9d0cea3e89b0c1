#!/usr/bin/env bash
# Numerics of the default model (Gemma 3 270M, Q4_K_M GGUF) per weight policy:
# teacher-forced agreement over the 100-prompt reference set, perplexity beside the fp32
# transformers reference, and the per-module cost of the default policy.
#   benchmarks/numerics_default.sh [OUT_DIR]      (needs the reference extra; ~30 min on 1 core)
set -euo pipefail
out=${1:-numerics-default}
mkdir -p "$out"
threads=${THREADS:-1}
export OMP_NUM_THREADS=$threads
calculet reference make -o "$out/ref.npz" --prompts 100 --tokens 32 --context 1024
for policy in default fp32 fp16 int8 int4 w4a8; do
  calculet compile -o "$out/$policy.calbin" --weights "$policy" --lanes 1 --decode-lanes 1 --context 1024 --no-golden
  calculet compare "$out/$policy.calbin" --reference "$out/ref.npz" --threads "$threads" --json "$out/compare-$policy.json" \
    > "$out/compare-$policy.txt"
  calculet eval perplexity "$out/$policy.calbin" --threads "$threads" --json "$out/ppl-$policy.json" > "$out/ppl-$policy.txt"
done
calculet eval perplexity --reference default --window 1024 --json "$out/ppl-reference.json" > "$out/ppl-reference.txt"
calculet eval module-costs --reference "$out/ref.npz" --weights default --json "$out/module-costs.json" \
  > "$out/module-costs.txt"
