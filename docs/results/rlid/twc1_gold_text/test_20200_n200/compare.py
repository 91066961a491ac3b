import json, sys
from rlid.evaluate import paired_difference, wilson_interval
def load(path): return {r['seed']: r for r in map(json.loads, open(path))}
base='runs/rlid_twc1_gold_text'
d1=load(f'{base}/eval/decision.episodes.jsonl'); t1=load(f'{base}/eval/token.episodes.jsonl')
d2=load(f'{base}/eval_20200_n200/decision.episodes.jsonl')
t2={}
for f in ('runs/rlid_twc1_gold/eval_20200_n100/token.episodes.jsonl','runs/rlid_twc1_gold/eval_20300_n100/token.episodes.jsonl'):
    t2.update(load(f))
assert sorted(t2)==sorted(d2)==list(range(20200,20400)), (len(t2), len(d2))
for name,(d,t) in (('set 2 (20200-20399)',(d2,t2)),('pooled 400',({**d1,**d2},{**t1,**t2}))):
    S=sorted(d)
    for key in ('success','reward'):
        a=[float(d[s][key]) for s in S]; b=[float(t[s][key]) for s in S]
        r=paired_difference(a,b)
        print(name, key, 'LDM', round(100*sum(a)/len(a),1) if key=='success' else round(sum(a)/len(a),3),
              'token', round(100*sum(b)/len(b),1) if key=='success' else round(sum(b)/len(b),3),
              'diff', [round(x*(100 if key=='success' else 1),1 if key=='success' else 3) for x in r])
    for nm,x in (('LDM',d),('token',t)):
        k=sum(x[s]['success'] for s in S); lo,hi=wilson_interval(k,len(S)); print(' ',nm,k,len(S),round(100*lo,1),round(100*hi,1),
          'invalid', sum(x[s]['invalid'] for s in S), 'moves', sum(x[s]['steps'] for s in S))
