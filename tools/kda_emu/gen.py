# kda.cu -> kda_emu.cpp: CUDA-only syntax to the emulator's (launches, shared memory, qualifiers)
import re, sys
def split_top(a):
    out, depth, cur = [], 0, ''
    for ch in a:
        if ch in '([': depth += 1
        if ch in ')]': depth -= 1
        if ch == ',' and depth == 0:
            out.append(cur.strip()); cur = ''
        else:
            cur += ch
    out.append(cur.strip())
    return out
def launch(m):
    p = split_top(m.group(2)) + ['0']
    return 'emu_launch(%s, dim3(%s), dim3(%s), %s, ' % (m.group(1), p[0], p[1], p[2])
s = open(sys.argv[1]).read()
s = re.sub(r'(\w+)<<<(.*?)>>>\(', launch, s, flags=re.S)
s = s.replace('extern __shared__ float sm[];', 'float *sm = emu_cur->smem.data();')
s = re.sub(r'__launch_bounds__\(\w+\)', '', s)
for q in ['__global__', '__device__', '__forceinline__']:
    s = s.replace(q, '')
s = s.replace('__restrict__', '__restrict')
s = s.replace('extern "C" ', '').replace('NULL', 'nullptr')
open(sys.argv[2], 'w').write('#include "emu.h"\n' + s)
