"""Write the default model (or any calculet source) as a Hugging Face folder for `optimum-cli`.

    python benchmarks/vs_openvino/export_hf.py OUT_DIR [SOURCE]      # main venv (calculet installed)

The weights are the very ones `calculet compile` reads (sources/: the GGUF dequantized to float32,
llama.cpp's conversion transforms undone), so OpenVINO and calculet start from the same numbers:
config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json and
generation_config.json. OpenVINO then quantizes these weights to int8 itself (README.md, step 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from calculet.sources.resolve import load_source


def export(out: Path, source: str | None = None) -> Path:
    model = load_source(source)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: np.ascontiguousarray(model.tensors[name], dtype=np.float32) for name in model.tensors}
    if model.config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**model.config, "torch_dtype": "float32"}, indent=1))
    (out / "tokenizer.json").write_text(model.tokenizer_json)
    (out / "tokenizer_config.json").write_text(json.dumps(model.tokenizer_config or {}, indent=1))
    (out / "generation_config.json").write_text(json.dumps(model.generation_config or {}, indent=1))
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__.splitlines()[2].strip())
    print(export(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else None))
