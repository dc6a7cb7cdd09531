#!/usr/bin/env python3
"""Every `clla` command line of the docs, parsed against the binary (tests/test_docs.sh).

usage: doc_commands.py CLLA FILE.md...

Reads fenced (```) and indented (4 spaces after a blank line) code blocks and inline code
spans, joins backslash continuations, splits each line into shell commands (|, &&, ||, ;) and
finds the clla invocations in them: `clla`, `build/clla`, `./build-cuda/clla`, any path ending
in /clla, `$CLLA`, `${CLLA}`, also after a launcher (`mpirun -np 2 ... clla train`, `srun`,
`time`, environment assignments). Each must name a command that `clla --help` lists and only
options that `clla <command> --help` prints (global options: `clla --help`). The options are
asked from the binary, never listed here, so a doc that names an option the binary does not
have fails, and one the binary gains passes at once.

Not checked: whether the values are valid and the files exist (the commands are not run).
Lines of program output ("clla train: resuming ...", "clla: error: ...") and placeholders
(`clla <command>`) are not commands. Prints one line per bad command (file:line: why) and
exits 1 if there is any.
"""
import re
import subprocess
import sys

OPT = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def help_text(clla, *args):
    r = subprocess.run([clla, *args, "--help"], capture_output=True, text=True)
    return r.stdout + r.stderr


def commands_and_options(clla):
    top = help_text(clla)
    cmds, on = {}, False
    for line in top.splitlines():
        if line.startswith("commands:"):
            on = True
        elif on and line.strip():
            cmds[line.split()[0]] = None
    for c in cmds:
        cmds[c] = set(OPT.findall(help_text(clla, c))) | {"--help"}
    return cmds, set(OPT.findall(top)) | {"--help"}


def code_lines(path):
    """(line number, text) of every code line and inline code span, continuations joined."""
    out, fence, prev_blank, indented = [], None, True, False
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        raw, no = lines[i], i + 1
        stripped = raw.strip()
        if fence is None and re.match(r"^\s*(```|~~~)", raw):
            fence = stripped[:3]
            i += 1
            continue
        if fence is not None and stripped.startswith(fence):
            fence = None
            i += 1
            continue
        is_code = fence is not None
        if fence is None:
            if raw.startswith("    ") and stripped and (prev_blank or indented):
                is_code = indented = True
            elif stripped:
                indented = False
        if is_code:
            text = raw
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            out.append((no, text))
        else:
            for span in re.findall(r"``(.+?)``|`([^`]+)`", raw):
                out.append((no, span[0] or span[1]))
        prev_blank = not stripped
        i += 1
    return out


CLLA_WORD = re.compile(r"""^["']?(clla|\S*/clla|\$CLLA|\$\{CLLA\})["']?$""")
# Words that run the command after them (with their own options before it).
LAUNCHERS = {"mpirun", "mpiexec", "srun", "time", "nohup", "env", "exec", "timeout", "numactl", "taskset", "sudo"}
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def invocations(text):
    """The argument lists after each clla word that runs clla (None when it is not a command)."""
    text = re.sub(r"(^|\s)#.*$", "", text)          # shell comment
    text = re.sub(r"^\s*[$>]\s+", "", text)          # prompt
    text = re.sub(r"\|(?=[^\[\]]*\])", " ", text)   # [--a X | --b Y], [cpu|cuda]: alternatives, not a pipe
    for seg in re.split(r"\|\||&&|[|;]|\$\(|`", text):
        words = seg.split()
        k = 0
        while k < len(words) and ENV_ASSIGN.match(words[k]):
            k += 1
        if k < len(words) and words[k] in LAUNCHERS:
            # the first clla word after a launcher and its options
            k = next((j for j in range(k + 1, len(words)) if CLLA_WORD.match(words[j])), len(words))
        if k < len(words) and CLLA_WORD.match(words[k]):
            yield words[k + 1:]


def check(clla, files):
    cmds, global_opts = commands_and_options(clla)
    if not cmds:
        print(f"cannot read the command list from '{clla} --help'")
        return 1
    bad = n = 0
    for path in files:
        for no, text in code_lines(path):
            for args in invocations(text):
                if args and (args[0].startswith("<") or args[0].endswith(":") or args[0] in ("...", "…")):
                    continue                         # a placeholder or a line of output
                n += 1
                where = f"{path}:{no}: {' '.join(text.split())[:120]}"
                if not args:
                    continue                         # `clla` alone
                if args[0].startswith("-"):
                    cmd, opts, known = None, args, global_opts
                else:
                    cmd, opts = args[0], args[1:]
                    if cmd not in cmds:
                        bad += 1
                        print(f"{where}\n    'clla {cmd}' is not a command (clla --help lists: {', '.join(cmds)})")
                        continue
                    known = cmds[cmd]
                for w in opts:
                    w = w.lstrip("[(")
                    for o in OPT.findall(w.split("=", 1)[0]) if w.startswith("--") else []:
                        if o not in known:
                            bad += 1
                            print(f"{where}\n    {o} is not an option of 'clla{' ' + cmd if cmd else ''}' (see clla{' ' + cmd if cmd else ''} --help)")
    print(f"{n} clla command lines in {len(files)} files, {bad} bad")
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(check(sys.argv[1], sys.argv[2:]))
