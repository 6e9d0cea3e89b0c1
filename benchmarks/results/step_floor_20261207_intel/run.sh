#!/bin/sh
# Every measurement of this directory, in order, through the AVX2 view (benchmarks/isa_view), nothing else running.
# ACTS and CALBIN: see down_groups.py. Run from the repository root with .venv active.
set -e
D=benchmarks/results/step_floor_20261207_intel
features() { python -c "from calculet.cpu_features import detect; print('CPU features:', detect().label)"; vmstat 1 2 | tail -1; }
{ echo "## native"; features; python $D/zp_float.py; } > $D/native.txt 2>&1
. ~/.cache/calculet/isa_view/avx2/env.sh
{ features
  echo "## head_kernels.py 1,2,4,8,16 s7,mnb4a4"; python $D/head_kernels.py 1,2,4,8,16 s7,mnb4a4
  echo "## attn_kernels.py 16,128,264,520"; python $D/attn_kernels.py 16,128,264,520
  echo "## chain_blocks.py 8 (gate/up [640 -> 4,096])"; python $D/chain_blocks.py 8 8b32,8b64,8b128,4b32,4b128 640 4096
  echo "## chain_blocks.py 8 (down [2,048 -> 640])"; python $D/chain_blocks.py 8 8b32,8b64,8b128,8b256,4b32 2048 640
  echo "## zp_float.py"; python $D/zp_float.py
  echo "## down_groups.py"; python $D/down_groups.py "$ACTS" "$CALBIN"
  features; } > $D/view.txt 2>&1
