# comm/mailbox_dev.cu -> plain C++ for the emulator (inc/cuda_runtime_api.h, emu.cpp): a launch
# `k<<<grid, block, smem, stream>>>(args);` becomes `emu_launch(grid, block, smem, stream, [=]() { k(args); });`
# (the arguments copied at the launch, as CUDA copies them), `__shared__ T name;` a reference to storage of the
# emulated block. Anything else of CUDA C++ the file uses comes from the headers in inc/.
import re, sys

src = open(sys.argv[1]).read()
n = [0]

def launch(m):
    return 'emu_launch(%s, [=]() { %s(%s); });' % (m.group(2), m.group(1), m.group(3))

out = re.sub(r'([A-Za-z_][\w:]*(?:<[^<>;]*>)?)<<<(.*?)>>>\((.*?)\);', launch, src, flags=re.S)

def shared(m):
    n[0] += 1
    return '%s &%s = emu_shared<%s>(%d);' % (m.group(1), m.group(2), m.group(1), n[0])

out = re.sub(r'__shared__\s+([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*;', shared, out)
if '<<<' in out or '__shared__' in out:
    raise SystemExit('gen.py: a launch or a shared variable left untranslated')
open(sys.argv[2], 'w').write('#include "emu_device.h"\n' + out)
