#!/usr/bin/env bash
# CUDA check, for a machine with an NVIDIA GPU (a few minutes): in a fresh environment with
# onnxruntime-gpu, (1) the CUDA tests: greedy parity with the CPU provider on tiny Llama/Qwen3/Gemma 3
# portable calbins and a GPU-resident KV, (2) greedy parity CPU vs CUDA on the default model's portable
# fp16 calbin, (3) a short serve benchmark of that calbin on CUDA with `calculet bench`.
#   benchmarks/cuda_check.sh [OUT_DIR]       (run from anywhere; needs .venv from .ci/run for torch)
# onnxruntime-gpu installs the module `onnxruntime`, so it gets an environment of its own, like
# .ci/run-openvino. Its CPU provider is the parity reference (the same build runs both).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-cuda-check}")
mkdir -p "$out"
TORCH_PYTHON=${TORCH_PYTHON:-.venv/bin/python}
CUDA_VENV=${CUDA_VENV:-.venv-cuda}
PORT=${PORT:-8093}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"

# Tiny HF folders need torch; the CUDA environment has none.
PYTHONPATH=src "$TORCH_PYTHON" tests/tiny_models.py "$out/tiny" llama qwen3 gemma3 >/dev/null

rm -rf "$CUDA_VENV"
python3 -m venv "$CUDA_VENV"
. "$CUDA_VENV/bin/activate"
pip install -q "onnxruntime-gpu[cuda,cudnn]"
pip install -q --no-deps -e .
pip install -q $(python - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["test"]
print(" ".join(d for d in deps if not d.startswith("onnxruntime")))
PY
)
# onnxruntime-gpu >= 1.21 finds the CUDA/cuDNN libraries of the nvidia-* wheels through preload_dlls.
python -c "import onnxruntime as o; getattr(o, 'preload_dlls', lambda: None)(); print(o.__version__, o.get_available_providers())" \
  | tee "$out/onnxruntime.txt"

echo "== 1. tiny models: CUDA vs CPU provider"
CALCULET_TINY_MODELS="$out/tiny" python -m pytest -q -rs tests/runtime/test_cuda.py 2>&1 | tee "$out/pytest.txt"

echo "== 2. default model: portable fp16, greedy CPU vs CUDA"
calbin="$out/default-fp16.calbin"
[ -d "$calbin" ] || calculet compile -o "$calbin" --target portable --weights fp16 --lanes 4 --context 2048 --no-golden
python - "$calbin" <<'PY' | tee "$out/parity-default.txt"
import sys
sys.path.insert(0, "tests")
from decoding import generate_one as generate   # the tests' greedy loop
from calculet.engine.sampler import SamplerConfig
from calculet.engine.tokenizer import TextTokenizer
from calculet.runtime.device import Device
from calculet.runtime.program import DeviceConfig

prompts = ["The capital of France is", "def fibonacci(n):", "Explain photosynthesis in one sentence.",
           "Translate to German: the weather is nice today."]
runs = {}
for provider in ("cpu", "cuda"):
    d = Device(DeviceConfig(provider))
    d.configure(d.load(sys.argv[1]))
    tok = TextTokenizer.from_program(d.program)
    runs[provider] = [generate(d, tok, tok.encode(p), SamplerConfig(temperature=0.0), 32, ignore_eos=True).tokens
                      for p in prompts]
    print(f"{provider}: load {d.program.load_seconds:.1f} s, KV store on {d.lanes.store.device}")
    d.close()
same = sum(a == b for a, b in zip(runs["cpu"], runs["cuda"]))
first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(runs["cpu"], runs["cuda"])]
print(f"prompts with equal 32 greedy tokens: {same}/{len(prompts)}; first differing step per prompt: {first}")
PY

echo "== 3. serve benchmark on CUDA"
calculet serve "$calbin" --provider cuda --port "$PORT" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break; sleep 1; done
model=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
calculet bench run --url "http://127.0.0.1:$PORT" --model "$model" --concurrency 1,4 --prompt-tokens 256 \
  --output-tokens 64 --requests 16 --out "$out/bench"
calculet bench report "$out/bench"
echo "results in $out (pytest.txt, parity-default.txt, bench/report.md)"
