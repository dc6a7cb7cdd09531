#include "common/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/num.h"
#include "common/util.h"

static void option_left(const ArgSpec *sp, char *left, size_t n) {
    const char *mv = sp->metavar ? sp->metavar : "VALUE";
    snprintf(left, n, "--%s%s%s", sp->name, sp->takes_value ? " " : "", sp->takes_value ? mv : "");
}

static void print_usage(const char *usage, const ArgSpec *specs, int n) {
    char left[64];
    int width = 6;   // "--help"
    for (int i = 0; i < n; i++) {
        option_left(&specs[i], left, sizeof(left));
        if ((int)strlen(left) > width) width = (int)strlen(left);
    }
    printf("%s\n\noptions:\n", usage);
    for (int i = 0; i < n; i++) {
        option_left(&specs[i], left, sizeof(left));
        printf("  %-*s  %s\n", width, left, specs[i].help);
    }
    printf("  %-*s  %s\n", width, "--help", "show this help");
}

void args_parse(Args *a, int argc, char **argv, const ArgSpec *specs, int n_specs, const char *usage,
                char **positional, int *n_positional, int max_positional) {
    memset(a, 0, sizeof(*a));
    if (n_positional) *n_positional = 0;
    if (n_specs > 32) die("internal: too many options");
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            print_usage(usage, specs, n_specs);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (!positional || *n_positional >= max_positional)
                die("unexpected argument '%s': run with --help for the usage", arg);
            positional[(*n_positional)++] = argv[i];
            continue;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int found = -1;
        for (int s = 0; s < n_specs; s++)
            if (strlen(specs[s].name) == len && !strncmp(specs[s].name, name, len)) found = s;
        if (found < 0) die("unknown option '%s': run with --help for the options", arg);
        const char *value = "1";
        if (specs[found].takes_value) {
            if (eq) value = eq + 1;
            else if (i + 1 < argc) value = argv[++i];
            else die("option --%s needs a value", specs[found].name);
            // an empty value names no file, number or text: "--out ''" would write into the
            // current directory, and an empty path reads as the file system's root
            if (!value[0]) die("option --%s is empty: give %s (see --help)", specs[found].name, specs[found].metavar ? specs[found].metavar : "a value");
        } else if (eq) {
            die("option --%s takes no value", specs[found].name);
        }
        if (!strcmp(specs[found].name, "set")) {
            if (a->n_sets >= 64) die("too many --set options (64 at most)");
            a->sets[a->n_sets++] = (char *)value;
        } else {
            // a single-valued option given twice: which one was meant is not ours to guess
            if (a->values[found] && specs[found].takes_value == 1 && strcmp(a->values[found], value))
                die("option --%s given twice ('%s' and '%s'): give it once", specs[found].name, a->values[found], value);
            a->values[found] = value;
            if (specs[found].takes_value == ARG_REPEAT) {
                if (a->n_repeats >= ARGS_MAX_REPEATS)
                    die("too many values of repeatable options at --%s: %d at most, the repeatable options of a command line "
                        "counted together (generate's --prompt, --stop and --stop-token among them): give many prompts "
                        "in --prompts FILE", specs[found].name, ARGS_MAX_REPEATS);
                a->repeat_spec[a->n_repeats] = found;
                a->repeat_value[a->n_repeats++] = value;
            }
        }
    }
}

const char *args_get(const Args *a, const ArgSpec *specs, int n_specs, const char *name) {
    for (int s = 0; s < n_specs; s++)
        if (!strcmp(specs[s].name, name)) return a->values[s];
    die("internal: no option named %s", name);
}

int args_get_all(const Args *a, const ArgSpec *specs, int n_specs, const char *name, const char **out, int max) {
    int spec = -1, n = 0;
    for (int s = 0; s < n_specs; s++)
        if (!strcmp(specs[s].name, name)) spec = s;
    if (spec < 0) die("internal: no option named %s", name);
    for (int i = 0; i < a->n_repeats; i++)
        if (a->repeat_spec[i] == spec) {
            if (n == max) die("too many --%s options (%d at most)", name, max);
            out[n++] = a->repeat_value[i];
        }
    return n;
}

// Through the strict parser (common/num.c), so options parse as config values do.
long long args_int(const char *name, const char *v, long long lo, long long hi) {
    char opt[96];
    snprintf(opt, sizeof(opt), "--%s", name);
    return (long long)opt_i64(opt, v, (int64_t)lo, (int64_t)hi);
}

double args_double(const char *name, const char *v) {
    char opt[96];
    snprintf(opt, sizeof(opt), "--%s", name);
    return opt_f64(opt, v, -HUGE_VAL, HUGE_VAL);
}

int args_is(const char *arg, const char *opt) {
    const size_t n = strlen(opt);
    return !strncmp(arg, opt, n) && (arg[n] == 0 || arg[n] == '=');
}

static void seen_once(ArgsSeen *seen, const char *opt) {
    for (int k = 0; k < seen->n; k++)
        if (seen->names[k] == opt || !strcmp(seen->names[k], opt)) die("option %s given twice: give it once", opt);
    if (seen->n < (int)(sizeof(seen->names) / sizeof(seen->names[0]))) seen->names[seen->n++] = opt;
}

int args_once(ArgsSeen *seen, const char *arg, const char *opt) {
    if (!args_is(arg, opt)) return 0;
    seen_once(seen, opt);
    return 1;
}

int args_flag(ArgsSeen *seen, const char *arg, const char *opt) {
    if (!args_is(arg, opt)) return 0;
    if (arg[strlen(opt)] == '=') die("option %s takes no value", opt);
    seen_once(seen, opt);
    return 1;
}

const char *args_next_value(int argc, char **argv, int *i, const char *cmd, int nonempty) {
    const char *opt = argv[*i], *eq = strchr(opt, '=');
    const int name_len = eq ? (int)(eq - opt) : (int)strlen(opt);
    const char *v;
    if (eq) {
        v = eq + 1;
    } else {
        if (*i + 1 >= argc) die("option %s needs a value: see 'clla %s --help'", opt, cmd);
        v = argv[++*i];
    }
    if (nonempty && !v[0]) die("option %.*s is empty: give a path (see 'clla %s --help')", name_len, opt, cmd);
    return v;
}
