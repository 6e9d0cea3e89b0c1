"""MatMulNBits, 4-bit blocks of 32 with accuracy_level 4: float zero points (what an exact re-encoding of a GGUF
Q4_K block, d*sc*q - dmin*m, would need) against packed uint8 ones, on a [4096 x 640] weight; error against a
numpy product of the dequantized weight. Run natively and inside the AVX2 view, from the repository root (it
imports benchmarks/matmulnbits_kernels.py; results in README.md)."""
import sys, time
from pathlib import Path
import numpy as np
from onnx import helper, TensorProto, numpy_helper
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from matmulnbits_kernels import open_session  # spins only while a call runs: the two sessions alternate
N,K,B=4096,640,32
nb=K//B
rng=np.random.default_rng(0)
q=rng.integers(0,16,(N,nb,B)).astype(np.uint8)
packed=(q[:,:,0::2] | (q[:,:,1::2]<<4)).astype(np.uint8)
scales=(rng.random((N,nb)).astype(np.float32)*0.01+0.001)
zpf=(rng.random((N,nb)).astype(np.float32)*8+4)   # fractional zero points
zpi=np.round(zpf).astype(np.uint8)
zpi_packed=(zpi[:,0::2] | (zpi[:,1::2]<<4)).reshape(-1).astype(np.uint8) if nb%2==0 else None
def model(zp):
    inits=[numpy_helper.from_array(packed,'B'),numpy_helper.from_array(scales.reshape(-1),'S'),numpy_helper.from_array(zp,'Z')]
    node=helper.make_node('MatMulNBits',['A','B','S','Z'],['Y'],domain='com.microsoft',K=K,N=N,bits=4,block_size=B,accuracy_level=4)
    g=helper.make_graph([node],'g',[helper.make_tensor_value_info('A',TensorProto.FLOAT,['M',K])],[helper.make_tensor_value_info('Y',TensorProto.FLOAT,['M',N])],inits)
    m=helper.make_model(g,opset_imports=[helper.make_opsetid('',21),helper.make_opsetid('com.microsoft',1)])
    return open_session(m, 2)
sf=model(zpf.reshape(-1)); si=model(zpi_packed)
for M in (1,8,128):
    a=rng.standard_normal((M,K)).astype(np.float32)
    deq=((q.astype(np.float32)-zpf[:,:,None])*scales[:,:,None]).reshape(N,K)
    ref=a@deq.T
    yf=sf.run(None,{'A':a})[0]
    err=np.abs(yf-ref).max()/np.abs(ref).max()
    ts={}
    for name,s in (('float zp',sf),('uint8 zp',si)):
        for _ in range(3): s.run(None,{'A':a})
        t=[]
        for _ in range(7):
            t0=time.perf_counter()
            for _ in range(10): s.run(None,{'A':a})
            t.append((time.perf_counter()-t0)/10*1e6)
        ts[name]=sorted(t)[3]
    print(f"M={M}: float-zp rel err {err:.2e}; float zp {ts['float zp']:.0f} us, uint8 zp {ts['uint8 zp']:.0f} us")
