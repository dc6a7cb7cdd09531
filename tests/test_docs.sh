#!/usr/bin/env bash
# The reference docs against the binary, so they cannot silently fall behind it:
#  - docs/CONFIG.md names every key of the config.json a run writes (every model and train key
#    model/config.c declares);
#  - docs/COMMANDS.md has a section for every command `clla --help` lists and names every
#    option of every `clla <cmd> --help`;
#  - docs/FORMAT.md names every tensor of a dense model (tied and untied).
# Needs CLLA (the binary) and SRC (the source tree); ctest sets both.
set -u
: "${CLLA:?set CLLA to the clla binary (ctest does this)}"
: "${SRC:?set SRC to the source tree (ctest does this)}"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/clla_test_docs.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1

PASS=0
FAIL=0
check() {   # check NAME MISSING...: passes when nothing is missing
    local name=$1; shift
    if [ $# -eq 0 ]; then PASS=$((PASS + 1)); echo "ok   $name"
    else FAIL=$((FAIL + 1)); echo "FAIL $name: missing $*"; fi
}

cat > m.json <<'EOF'
{"attention": "gqa", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48}
EOF
if ! "$CLLA" init --config m.json --out untied > /dev/null 2> init.err ||
   ! "$CLLA" init --config m.json --out tied --set tie_word_embeddings=true > /dev/null 2>> init.err; then
    echo "FAIL clla init: $(cat init.err)"
    echo "0 passed, 1 failed"
    exit 1
fi

# ---------------------------------------------------------------- config keys
# config.json is printed one key per line ("key": value); nested "train" keys the same way.
missing=()
for k in $(grep -o '^[[:space:]]*"[a-z_0-9]*":' untied/config.json | tr -d ' \t":'); do
    [ "$k" = train ] && continue
    grep -q "\`$k\`" "$SRC/docs/CONFIG.md" || missing+=("$k")
done
check "docs/CONFIG.md names every config key" "${missing[@]}"

# ---------------------------------------------------------------- commands and options
missing=()
cmds=$("$CLLA" --help | awk '/^commands:/ { on = 1; next } on && NF { print $1 }')
for c in $cmds; do
    grep -q "^## clla $c\$" "$SRC/docs/COMMANDS.md" || missing+=("section:$c")
    for o in $("$CLLA" "$c" --help | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
        [ "$o" = --help ] && continue
        grep -qE -- "$o([^a-z0-9-]|\$)" "$SRC/docs/COMMANDS.md" || missing+=("$c:$o")
    done
done
check "docs/COMMANDS.md covers every command and option" "${missing[@]}"

# ---------------------------------------------------------------- tensor names
# The safetensors header: 8-byte little-endian length, then JSON with one key per tensor.
tensor_names() {
    local n
    n=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
    tail -c +9 "$1" | head -c "$n" | grep -o '"[a-z_]*\.[a-z_.0-9]*weight"' | tr -d '"' |
        sed -E 's/\.layers\.[0-9]+\./.layers.{l}./' | sort -u
}
missing=()
for t in $(tensor_names untied/model.safetensors) $(tensor_names tied/model.safetensors); do
    grep -q "\`$t\`" "$SRC/docs/FORMAT.md" || missing+=("$t")
done
n_untied=$(tensor_names untied/model.safetensors | wc -l)
[ "$n_untied" -ge 12 ] || missing+=("(only $n_untied tensor names read from the header)")
check "docs/FORMAT.md names every dense tensor" "${missing[@]}"

# ---------------------------------------------------------------- documented command lines
# First a planted doc with one bad line of each shape (fenced, indented, a continuation, an
# mpirun launch, build/clla and $CLLA prefixes, an inline span): each must be reported.
if ! command -v python3 > /dev/null; then
    FAIL=$((FAIL + 1)); echo "FAIL documented command lines: python3 is needed to parse the docs"
else
    cat > planted.md <<'EOF'
```bash
clla train --config c.json --data x.bin
mpirun -np 2 build/clla eval --model runs/x \
    --data x.bin
$CLLA evaluate --checkpoint runs/x
clla info --config c.json --cache-table   # fine
```

    ./build/clla tokenizer train --vocab-size 300 --bogus-flag --out t.tok a.txt

Inline: `clla init --config c.json --output DIR`; output lines are not commands:
```
clla train: gqa | 19616 params
clla: error: something
```
EOF
    python3 "$SRC/tests/lib/doc_commands.py" "$CLLA" planted.md > planted.out 2>&1
    missing=()
    for want in "planted.md:2: clla train" "--data is not an option of 'clla train'" "planted.md:3: mpirun" \
                "--model is not an option of 'clla eval'" "'clla evaluate' is not a command" \
                "--bogus-flag is not an option of 'clla tokenizer'" "--output is not an option of 'clla init'" \
                "6 clla command lines in 1 files, 5 bad"; do
        grep -qF -- "$want" planted.out || missing+=("[$want]")
    done
    check "the command-line check reports each bad line of a planted doc" "${missing[@]}"
    [ ${#missing[@]} -eq 0 ] || sed 's/^/    /' planted.out

    # every doc, docs/DESIGN.md included (the commands it once named ahead of time all exist now)
    if python3 "$SRC/tests/lib/doc_commands.py" "$CLLA" "$SRC/README.md" "$SRC"/docs/*.md > docs_cmd.out 2>&1; then
        check "every clla command line of README.md and docs/ uses real commands and options ($(tail -n 1 docs_cmd.out))"
    else
        check "every clla command line of README.md and docs/ uses real commands and options" "(see below)"
        sed 's/^/    /' docs_cmd.out
    fi
fi

# ---------------------------------------------------------------- clla info lines run
# `clla info --config configs/...` allocates nothing: every such line of the README, docs/ and the
# quickstart is run as written (up to a pipe), so that a config refusal does not break what a
# user copies (the quickstart's MHA line, --set n_routed_experts=0 on an MoE config, exited 1
# once MoE knobs on a dense model were refused)
bad=()
n_info=0
while IFS= read -r line; do
    n_info=$((n_info + 1))
    # shellcheck disable=SC2086
    (cd "$SRC" && eval "\"\$CLLA\" ${line#*clla }") > /dev/null 2> info_line.err || bad+=("[$line: $(head -n 1 info_line.err)]")
done < <(python3 - "$SRC/README.md" "$SRC"/docs/*.md "$SRC/scripts/quickstart.sh" <<'PYEOF'
import re, sys
out = set()
for path in sys.argv[1:]:
    text = open(path).read()
    if path.endswith(".sh"):
        spans = text.splitlines()
    else:
        # the lines of fenced code blocks, then inline code spans of the prose (which may wrap lines)
        fences = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
        spans = [l for f in fences for l in f.splitlines()] + [m.replace("\n", " ") for m in re.findall(r"`([^`]+)`", prose)]
    for s in spans:
        m = re.search(r"clla info --config configs/[^|`;#<]*", s)
        if m and "<" not in s[m.start():m.end() + 1]:
            out.add(" ".join(m.group(0).split()))
print("\n".join(sorted(out)))
PYEOF
)
check "every 'clla info --config configs/...' line of the docs and the quickstart runs ($n_info lines)" "${bad[@]}"

echo "$PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
