"""Reference runs and golden outputs (optional `reference` extra).

- `hf`: rebuilds a `SourceModel` in transformers (fp32, eager attention) and runs it: last logits,
  top-k, greedy tokens. The only module that imports torch/transformers, and only when called.
- `prompts`: the fixed golden prompt set (exact token lengths, natural text).
- `golden`: make / write / read `golden/golden.json` and check any runtime against it (numpy only).
- `metrics`: the numpy comparisons the check uses.
"""
