"""Issue 42 measurement (not part of infersched): how much of the binned batch-index
problem's minimum its local-polytope LP (what `solver/src/bounds/batch_index.rs` bounds
through MPLP's dual) leaves open, against the same problem solved exactly (a MILP) and
with triplet consistency added (all triples; or triples on coarse groups of bins).

Offline requests (the first N of the workload), llama2-7b-a100's coefficients, C = 2,048;
bins of sum(nb) / NBINS batches up to sum(nb), then doubling (as phi_mplp.py), each
request's counts from its fewest batches. Prints the minimum over N (seconds).

usage: python3 phi_lp_gap.py WORKLOAD.csv N NBINS pair|milp|tri|ctri [GROUPS]
       (needs numpy and scipy; HiGHS through scipy.optimize)
  e.g. python3 phi_lp_gap.py c32.csv 12 30 pair; python3 phi_lp_gap.py c32.csv 12 30 milp
"""
import csv, math, sys, time, itertools
import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog, milp, LinearConstraint, Bounds
one=2.07552e-3; tok=6.112e-5; dkv=2.72416e-7; attn=5.36736e-9; ctx=2.95168e-7; npf=4.9088e-5; ndec=2.368e-5; hp=2.9632e-3; hd=6.1472e-4
C=2048
b=one+min(hp,hd); s=max(hp-hd,0)
allreqs=[(int(r['num_prefill_tokens']),int(r['num_decode_tokens'])) for r in csv.DictReader(open(sys.argv[1]))]
N=int(sys.argv[2]); NBINS=int(sys.argv[3]); mode=sys.argv[4]; NCOARSE=int(sys.argv[5]) if len(sys.argv)>5 else 0
reqs=allreqs[:N]; n=N
def prompt_work(p):
    return 0 if p<=0 else tok*p+attn*p*p+npf+s*p/C
F=[];NB=[];W=[]
for I,O in reqs:
    ch=math.ceil(I/C); nb=ch+O-1
    f=[0.0]
    for e in range(1,ch+1): f.append(prompt_work(I-(ch-e)*C))
    for k in range(1,O): f.append(f[-1]+tok+ndec+dkv*(I+k))
    F.append(f);NB.append(nb);W.append(f[-1])
def g(i,d):
    if d<=0: return W[i]
    e=NB[i]-d
    return F[i][e] if e>0 else 0.0
def phi(c):
    tot=0.0
    for j in range(n):
        tot+=b*c[j]+W[j]
        for i in range(n):
            if i!=j: tot+=g(i,c[i]-c[j])
    return tot
HMAX=int(phi(NB)/b)+1
W_BIN=max(1,sum(NB)//NBINS)
edges_b=[0]
while edges_b[-1]<sum(NB): edges_b.append(edges_b[-1]+W_BIN)
w=W_BIN
while edges_b[-1]<HMAX: w*=2; edges_b.append(edges_b[-1]+w)
lo=np.array(edges_b[:-1]); hi=np.array(edges_b[1:])-1
B=len(lo)
dom=[[p for p in range(B) if hi[p]>=NB[i]] for i in range(n)]
U=[{p: b*max(lo[p],NB[i])+W[i] for p in dom[i]} for i in range(n)]
def pcost(i,j,p,q):
    dl=max(lo[p],NB[i])-hi[q]; dh=hi[p]-max(lo[q],NB[j])
    cl=lambda d: min(max(d,-NB[j]-1),NB[i]+1)
    dl=cl(dl); dh=cl(dh)
    return min(g(i,d)+g(j,-d) for d in range(dl,dh+1))
pairs=list(itertools.combinations(range(n),2))
var={}; cost=[]
def newvar(key,c):
    var[key]=len(cost); cost.append(c)
for i in range(n):
    for p in dom[i]: newvar(('u',i,p),U[i][p])
PC={}
for (i,j) in pairs:
    for p in dom[i]:
        for q in dom[j]:
            c=pcost(i,j,p,q); PC[(i,j,p,q)]=c; newvar(('e',i,j,p,q),c)
trip=list(itertools.combinations(range(n),3)) if mode in ('tri','ctri') else []
if mode=='ctri':
    # coarse groups: global bins cut into NCOARSE runs of about equal count
    grp=[min(NCOARSE-1, p*NCOARSE//B) for p in range(B)]
else:
    grp=list(range(B))
cdom=[sorted(set(grp[p] for p in dom[i])) for i in range(n)]
for (i,j,k) in trip:
    for p in cdom[i]:
        for q in cdom[j]:
            for r in cdom[k]: newvar(('t',i,j,k,p,q,r),0.0)
rows=[];cols=[];vals=[];rhs=[];r=0
def row(entries,v):
    global r
    for (k,c) in entries: rows.append(r); cols.append(var[k]); vals.append(c)
    rhs.append(v); r+=1
for i in range(n): row([(('u',i,p),1) for p in dom[i]],1)
for (i,j) in pairs:
    for p in dom[i]: row([(('e',i,j,p,q),1) for q in dom[j]]+[(('u',i,p),-1)],0)
    for q in dom[j]: row([(('e',i,j,p,q),1) for p in dom[i]]+[(('u',j,q),-1)],0)
def proj(a,b_,P,Q):
    if mode=='tri': return [(('e',a,b_,P,Q),-1)]
    return [(('e',a,b_,p,q),-1) for p in dom[a] if grp[p]==P for q in dom[b_] if grp[q]==Q]
for (i,j,k) in trip:
    for p in cdom[i]:
        for q in cdom[j]: row([(('t',i,j,k,p,q,x),1) for x in cdom[k]]+proj(i,j,p,q),0)
    for p in cdom[i]:
        for x in cdom[k]: row([(('t',i,j,k,p,q,x),1) for q in cdom[j]]+proj(i,k,p,x),0)
    for q in cdom[j]:
        for x in cdom[k]: row([(('t',i,j,k,p,q,x),1) for p in cdom[i]]+proj(j,k,q,x),0)
A=sp.csr_matrix((vals,(rows,cols)),shape=(r,len(cost)))
t0=time.time()
c=np.array(cost)
if mode=='milp':
    integ=np.array([1 if k[0]=='u' else 0 for k in sorted(var,key=var.get)])
    res=milp(c,constraints=LinearConstraint(A,rhs,rhs),integrality=integ,bounds=Bounds(0,1),options={'time_limit':300})
else:
    res=linprog(c,A_eq=A,b_eq=rhs,bounds=(0,None),method='highs')
print(mode,'n',n,'bins',B,'width',W_BIN,'vars',len(cost),'value/n',res.fun/n if res.fun is not None else None,'status',res.status,'%.1fs'%(time.time()-t0))
