// Minimal long-option parsing shared by the subcommands: "--name value" and
// "--name=value", repeated "--set k=v", and "--help". Unknown options are errors.
#ifndef CLLA_COMMON_ARGS_H
#define CLLA_COMMON_ARGS_H

typedef struct ArgSpec {
    const char *name;      // without the leading dashes
    int takes_value;       // 0: a flag; 1: a value; ARG_REPEAT: a value, repeatable (args_get_all)
    const char *help;      // one line for --help
    const char *metavar;   // the value's name in --help ("FILE", "N", "auto|DIR"); NULL for a flag
} ArgSpec;

#define ARG_REPEAT 2
#define ARGS_MAX_REPEATS 256

typedef struct Args {
    const char *values[32];   // per spec: the value ("1" for a set flag; a repeatable one's last), or NULL
    int repeat_spec[ARGS_MAX_REPEATS];          // every ARG_REPEAT value in command-line order
    const char *repeat_value[ARGS_MAX_REPEATS];
    int n_repeats;
    char *sets[64];           // every --set value, in order
    int n_sets;
} Args;

// Parses argv[1..] (argv[0] is the subcommand name). Prints usage and exits 0 on --help;
// dies on an unknown option or a missing value. positional/n_positional may be NULL.
void args_parse(Args *a, int argc, char **argv, const ArgSpec *specs, int n_specs, const char *usage,
                char **positional, int *n_positional, int max_positional);
const char *args_get(const Args *a, const ArgSpec *specs, int n_specs, const char *name);
// A number parsed whole or refused: dies naming --name when v is not one, or (integers) when it is
// outside [lo, hi].
long long args_int(const char *name, const char *v, long long lo, long long hi);
double args_double(const char *name, const char *v);
// For the commands that walk argv themselves (clla prep, clla tokenizer): is arg the option opt
// ("--out"), given as "--out" or "--out=VALUE"? And its value: after the '=', or the next argument
// (advancing *i), dying when there is none, or, for a path (nonempty), when it is "".
int args_is(const char *arg, const char *opt);
const char *args_next_value(int argc, char **argv, int *i, const char *cmd, int nonempty);
// The options such a command was given, so that each single-valued one is taken once (a second is
// refused, as args_parse refuses it: "--out a --out b" wrote to b without a word).
typedef struct ArgsSeen {
    const char *names[32];
    int n;
} ArgsSeen;
// args_is, and dies when opt was matched before ("option --out given twice: give it once").
int args_once(ArgsSeen *seen, const char *arg, const char *opt);
// A flag: arg is exactly opt (dies on "--overwrite=1": a flag takes no value), once.
int args_flag(ArgsSeen *seen, const char *arg, const char *opt);
// Every value of a repeatable option in command-line order; returns the count (dies above max).
int args_get_all(const Args *a, const ArgSpec *specs, int n_specs, const char *name, const char **out, int max);

#endif
