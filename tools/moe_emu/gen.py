# A .cu / .cuh file -> plain C++ for the fiber emulator (inc/emu.h): launches become emu_launch, shared memory
# per-block buffers, inline PTX calls of the emulated instructions (an instruction not listed is an error).
import re, sys

def match_paren(s, i):  # s[i] == '(' -> index of its ')', skipping string literals
    depth, j = 0, i
    while j < len(s):
        ch = s[j]
        if ch == '"':
            j += 1
            while s[j] != '"':
                j += 2 if s[j] == '\\' else 1
        elif ch == '(':
            depth += 1
        elif ch == ')':
            depth -= 1
            if depth == 0:
                return j
        j += 1
    raise SystemExit('gen.py: unbalanced parentheses')

def split_top(a, sep):
    out, depth, cur, j = [], 0, '', 0
    while j < len(a):
        ch = a[j]
        if ch == '"':
            k = j + 1
            while a[k] != '"':
                k += 2 if a[k] == '\\' else 1
            cur += a[j:k + 1]; j = k + 1; continue
        if ch in '([{': depth += 1
        if ch in ')]}': depth -= 1
        if ch == sep and depth == 0:
            out.append(cur.strip()); cur = ''
        else:
            cur += ch
        j += 1
    out.append(cur.strip())
    return out

def operands(part):
    ops = []
    for o in split_top(part, ','):
        if not o: continue
        m = re.match(r'"([^"]*)"\s*\((.*)\)$', o, re.S)
        if not m: raise SystemExit('gen.py: operand %r' % o)
        ops.append(m.group(2).strip())
    return ops

def ptx(text, ops):
    t = ' '.join(text.split())
    o = lambda i: '(%s)' % ops[i]
    if t.startswith('mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32'):
        # {%0..%3} = D, {%4..%7} = A, {%8,%9} = B, C named by the last braces
        m = re.search(r'\{(%\d+),(%\d+),(%\d+),(%\d+)\};$', t.replace(' ', ''))
        c = [ops[int(x[1:])] for x in m.groups()]
        return 'emu_mma_m16n8k16_bf16(%s)' % ', '.join(ops[0:10] + c)
    if t.startswith('mul.rn.bf16x2 %0, %1, %2;'):
        return '%s = emu_mul_rn_bf16x2(%s, %s)' % (o(0), o(1), o(2))
    if t.startswith('cvt.rn.bf16x2.f32 %0, %1, %2;'):
        return '%s = emu_cvt_rn_bf16x2_f32(%s, %s)' % (o(0), o(1), o(2))
    m = re.match(r'cp\.async\.(ca|cg)\.shared\.global \[%0\], \[%1\], (\d+)(?:, %2)?;$', t)
    if m:
        return 'emu_cp_async(%s, %s, %s, %s)' % (o(0), o(1), m.group(2), o(2) if len(ops) > 2 else m.group(2))
    if t == 'cp.async.commit_group;':
        return 'emu_cp_async_commit()'
    if t == 'cp.async.wait_group %0;':
        return 'emu_cp_async_wait(%s)' % o(0)
    if t in ('griddepcontrol.launch_dependents;', 'griddepcontrol.wait;') or t.startswith('prefetch.global.L2 '):
        return '(void)0'  # one launch at a time in the emulator: nothing to order, nothing to prefetch
    flat = ' '.join(text.replace('\\n', ' ').replace('\\t', ' ').split())
    if flat.startswith('{ .reg .pred p;') and 'ld.const.u64 d0, [k3c_stamp_ctl_];' in flat:
        return 'emu_stamp_put(k3c_stamp_ctl_, %s, %s)' % (o(0), o(1))  # cuda/stamp.cuh K3C_STAMP_PUT
    m = re.match(r'mov\.u(?:32|64) %0, %%(globaltimer|gridid|smid|warpid);$', t)
    if m:  # the block stamps' registers (cuda/stamp.cuh)
        return '%s = emu_%s()' % (o(0), m.group(1))
    if t.startswith('ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];'):
        return 'emu_ld_v4_u32(%s, %s, %s, %s, %s)' % (o(0), o(1), o(2), o(3), o(4))
    raise SystemExit('gen.py: no emulation of the PTX %r' % t)

def rewrite_asm(s):
    out, i = '', 0
    for m in re.finditer(r'\basm\s*(?:volatile\s*)?\(', s):
        if m.start() < i: continue
        j = match_paren(s, m.end() - 1)
        parts = split_top(s[m.end():j], ':') + ['', '', '']
        text = ''.join(re.findall(r'"((?:[^"\\]|\\.)*)"', parts[0]))
        out += s[i:m.start()] + ptx(text, operands(parts[1]) + operands(parts[2]))
        i = j + 1
    return out + s[i:]

def launch(m):
    p = split_top(m.group(2), ',') + ['0']
    return 'emu_launch(%s, dim3(%s), dim3(%s), %s, ' % (m.group(1), p[0], p[1], p[2])

def shared(m):
    typ, decls = m.group(1), split_top(m.group(2), ',')
    out = []
    for d in decls:
        dm = re.match(r'(\w+)\s*((?:\[[^\]]*\])*)$', d)
        out.append('auto &%s = emu_shared<%s%s>("%s");' % (dm.group(1), typ, dm.group(2), dm.group(1)))
    return ' '.join(out)

s = open(sys.argv[1]).read()
s = rewrite_asm(s)
s = re.sub(r'(\w+(?:<[^<>()]*>)?)<<<(.*?)>>>\(', launch, s, flags=re.S)  # kernel or kernel<T>
s = re.sub(r'extern __shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\[\];',
           r'\1 *\2 = (\1 *)emu_dyn_smem();', s)
s = re.sub(r'(?<!extern )__shared__\s+([\w ]+?)\s+([^;]+);', shared, s)
while '__launch_bounds__(' in s:  # nested parentheses: cut by matching
    i = s.index('__launch_bounds__(')
    s = s[:i] + s[match_paren(s, i + len('__launch_bounds__')) + 1:]
s = re.sub(r'__align__\(\d+\)', '', s)
for q in ['__global__', '__device__', '__constant__', '__grid_constant__']:
    s = s.replace(q, '')
s = s.replace('__forceinline__', 'inline')  # header helpers: one definition across translation units
s = s.replace('__restrict__', '__restrict')
s = s.replace('extern "C" ', '').replace('NULL', 'nullptr')
# test hook: EMU_WPR forces the warps per band of moe.cu's launcher
s = s.replace('for (int wpr = 1; wpr <= MOE_WARPS; wpr *= 2) {',
              'for (int wpr = 1; wpr <= MOE_WARPS; wpr *= 2) {\n        if (emu_force_wpr > 0 && wpr != emu_force_wpr) continue;')
open(sys.argv[2], 'w').write('#include "emu.h"\n' + s)
