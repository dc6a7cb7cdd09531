# Shared by the shell tests that run many named cases (sourced, not run).
#   cases_begin NAME   a temporary directory $TMP (removed on exit) and zeroed counters
#   run_case NAME CMD  runs CMD with its output in $TMP/NAME.log, counts PASS/FAIL, then calls
#                      case_report LOG (default: the whole log, indented; a script may redefine it)
# Scripts print "$pass passed, $fail failed" at the end themselves.
cases_begin() {
    TMP=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    trap 'rm -rf "$TMP"' EXIT
    pass=0
    fail=0
    failed_names=""
}

case_report() { sed 's/^/    /' "$1"; }

run_case() {
    local name=$1
    shift
    local log="$TMP/$name.log"
    if "$@" >"$log" 2>&1; then
        pass=$((pass + 1))
        echo "PASS $name"
    else
        fail=$((fail + 1))
        failed_names="$failed_names $name"
        echo "FAIL $name"
    fi
    case_report "$log"
}
