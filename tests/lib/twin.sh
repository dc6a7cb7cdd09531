# Shared by the PyTorch-twin tests (sourced, not run): sets PY (Debian's interpreter, which has
# python3-torch), SRC, REF and TWIN, and exits 77 with the reason when torch/numpy or the clla
# binary ($CLLA) is missing.
PY=/usr/bin/python3
SRC=${SRC:-$(cd "$(dirname "$0")/.." && pwd)}
REF="$SRC/tests/reference"
TWIN="$REF/twin.py"
if [ ! -x "$PY" ] || ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    echo "SKIP: $PY cannot import torch and numpy (apt-get install python3-torch python3-numpy)"
    exit 77
fi
if [ -z "${CLLA:-}" ] || [ ! -x "$CLLA" ]; then
    echo "SKIP: CLLA is not set to the clla binary (run through ctest, or CLLA=build/clla bash $0)"
    exit 77
fi
