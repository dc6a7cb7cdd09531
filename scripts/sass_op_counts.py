#!/usr/bin/env python3
"""Op counts of the tensor-core attention kernels in a `cuobjdump --dump-sass` listing.

    python3 scripts/sass_op_counts.py SASS_FILE [--match attention_tc]

One line per (architecture, kernel): its instructions in all and the count of each opcode, most
frequent first (HMMA: tensor-core products, LDSM: ldmatrix, LDGSTS: cp.async, MUFU: exp2...).
scripts/gpu_profile_attention.sh runs it on the GPU machine; docs/GPU.md reads its output.
"""
import collections
import re
import sys

INSTR = re.compile(r'\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)')
KERNEL = re.compile(r'_Z\d+(?:attention_tc_)?(\w+?)_kernelILi(\d+)ELi(\d+)E')


def main(argv):
    if len(argv) < 2 or argv[1] in ('-h', '--help'):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    match = argv[3] if len(argv) > 3 and argv[2] == '--match' else 'attention_tc'
    try:
        text = open(argv[1]).read()
    except OSError as e:
        print(f'sass_op_counts: cannot read {argv[1]}: {e.strerror}', file=sys.stderr)
        return 1
    arch, found = 'unknown', 0
    for block in re.split(r'(?=\n\s*arch = sm_\d+|\n\s*Function : )', text):
        head = re.search(r'arch = (sm_\d+)', block)
        if head and 'Function :' not in block:
            arch = head.group(1)
            continue
        name = re.search(r'Function : (\S+)', block)
        if not name or match not in name.group(1):
            continue
        ops = collections.Counter(m.group(1) for m in map(INSTR.match, block.split('\n')) if m)
        k = KERNEL.search(name.group(1))
        short = f'{k.group(1)}<{k.group(2)},{k.group(3)}>' if k else name.group(1)
        print(arch, short, 'total', sum(ops.values()), ' '.join(f'{op}:{n}' for op, n in ops.most_common()))
        found += 1
    if not found:
        print(f'sass_op_counts: no function matching {match!r} in {argv[1]}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
