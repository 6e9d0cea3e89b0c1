#!/bin/bash
# $1 = on|off
cd /work/main
rm -f /tmp/w/gclog.txt
PATCH=""
[ "$1" = off ] && PATCH="import calculet.server.heap as h; h.settle=lambda: None; "
PYTHONPATH=/tmp/w/gcsite nohup .venv/bin/python -c "${PATCH}import sys; from calculet.cli import main; sys.argv=['calculet','serve','--port','8311','--threads','2']; sys.exit(main())" > /tmp/w/gcserve-$1.log 2>&1 &
for i in $(seq 90); do curl -s localhost:8311/v1/models | grep -q '"id"' && break; sleep 2; done
M=$(curl -s localhost:8311/v1/models | python3 -c 'import json,sys;print(json.load(sys.stdin)["data"][0]["id"])')
T0=$(date +%s.%N)
.venv/bin/calculet bench run --url http://127.0.0.1:8311 --model $M --concurrency 8 --requests 96 --prompt-tokens 200 --output-tokens 128 --warmup 2 --no-progress --out /tmp/w/gcab-$1 2>&1 | grep 'closed-c8' | head -1
T1=$(date +%s.%N)
pkill -TERM -f 'port.*8311'; sleep 4
echo "window $T0 $T1"
cat /tmp/w/gclog.txt
python3 - "$T0" "$T1" <<'P'
import sys, ast
t0, t1 = map(float, sys.argv[1:])
line = [l for l in open('/tmp/w/gclog.txt') if l.startswith('gen2: [')][0]
ev = ast.literal_eval(line[6:])
print("gen2 during the bench:", [ms for ms, t in ev if t0 <= t <= t1])
P
