import numpy as np, onnxruntime as ort, sys, time, statistics
so=ort.SessionOptions(); so.intra_op_num_threads=2
H=np.load('/tmp/pca/docs_test.npy')
res={}
sess={}
for cb in sys.argv[1].split(','):
    for g in ('head_1','head_8'):
        sess[(cb,g)]=ort.InferenceSession(f'{cb}/graphs/{g}.onnx',so,providers=['CPUExecutionProvider'])
for rnd in range(int(sys.argv[2])):
    for key in (list(sess) if rnd%2==0 else list(sess)[::-1]):
        s=sess[key]; rows=1 if key[1]=='head_1' else 8
        for i in range(3): s.run(['topk_ids'],{'hidden':H[i*8:i*8+rows]})
        t0=time.perf_counter()
        for i in range(20): s.run(['topk_ids','topk_values'],{'hidden':H[i*8:i*8+rows]})
        res.setdefault(key,[]).append((time.perf_counter()-t0)/20*1e3)
for g in ('head_1','head_8'):
    base=None
    for cb in sys.argv[1].split(','):
        m=statistics.median(res[(cb,g)]); base=base or res[(cb,g)]
        ratio=statistics.median([a/b for a,b in zip(res[(cb,g)],base)])
        print(f"{g} {cb}: median {m:.2f} ms, fastest {min(res[(cb,g)]):.2f}; per-round ratio {ratio:.3f}")
