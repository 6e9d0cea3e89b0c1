"""`calculet plan`: what compile would build for a source, and whether it fits on the chips.

It plans a compile; it reads no calbin. Hyperparameters come through `models/` and `sources/`, the
weights through the compiler's own tensor list (`compiler/weight_plan.py`), the workspace through
`compiler/workspace.py`.
"""
