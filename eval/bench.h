// Multiple-choice benchmarks (docs/BENCHMARKS.md): items read from JSONL, few-shot prompts built
// from a dev split, each choice scored by the log-likelihood of its continuation given the
// context, passing through the KV cache (the context prefilled, the continuation decoded token
// by token through it) or, to check that path, through the full-sequence forward.
//
// Scoring rule (as lm-evaluation-harness reports multiple-choice tasks): acc counts items whose
// label has the highest summed continuation log-likelihood; acc_norm the same after dividing each
// sum by the continuation's length in UTF-8 bytes. Ties go to the lower choice index. Each comes
// with its standard error sqrt(p (1 - p) / (n - 1)).
#ifndef CLLA_EVAL_BENCH_H
#define CLLA_EVAL_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "model/cache.h"
#include "model/model.h"

#define BENCH_MAX_CHOICES 16
// Sequences (choices) scored together at most: several items share one prefill and one run of
// decode steps (bench_score_batch).
#define BENCH_BATCH_SEQS 32

typedef struct BenchItem {
    char *context;        // the text before the scored part
    char **choices;       // n_choices non-empty strings
    int n_choices;
    int label;            // index of the right choice
    char *continuation;   // partial scoring (Winogrande): the shared text scored after context + choice; NULL otherwise
    char *header;         // text put before the few-shot examples (MMLU's subject line), or NULL
    char *group;          // few-shot pool: shots come from dev items of the same group ("" = one pool)
    int dev;              // split "dev": a few-shot example, not scored
    int line;             // line number in the file (1-based)
    uint64_t context_hash, group_hash;   // FNV-1a of context and group: the few-shot pool compares these first
} BenchItem;

typedef struct Bench {
    char *path;
    const char *format;   // "generic" or "hellaswag"
    BenchItem *items;     // every valid item, dev and scored, in file order
    int n_items;
    int n_dev;
    int n_skipped;        // bad lines skipped (skip_bad)
} Bench;

// Reads a benchmark file. The format is told by the keys of its first object: "context" and
// "choices" (generic) or "ctx" and "endings" (HellaSwag as llm.c reads it). A bad line (not
// JSON, a missing or mistyped key, a label out of range, an empty choice) fails with
// "FILE:LINE: problem" in err, or, with skip_bad, is warned about, counted and skipped.
// Returns 0, or -1 with one line in err (nothing is kept).
int bench_load(Bench *b, const char *path, int skip_bad, char *err, size_t errlen);
void bench_free(Bench *b);

// The prompt context of scored item `item` (an index into b->items, not a dev item) with K
// shots: header, then K examples (context + right choice [+ continuation]) drawn without
// replacement from the item's pool with an RNG seeded by (seed, item), each followed by a blank
// line, then the item's context. The pool is the dev items of the item's group; when the file
// has no dev item at all, the other scored items of the group (lm-evaluation-harness does the
// same); either way never an item whose context equals this one's. Returns a new string, or
// NULL with one line in err when the pool holds fewer than K examples.
char *bench_prompt(const Bench *b, int item, int K, uint64_t seed, char *err, size_t errlen);

// Log-likelihoods of one item's choices: per choice the summed log-probability of its
// continuation tokens, their count and the continuation's bytes.
typedef struct BenchScores {
    int n_choices;
    double loglik[BENCH_MAX_CHOICES];
    int tokens[BENCH_MAX_CHOICES];
    int bytes[BENCH_MAX_CHOICES];
    int truncated;        // context tokens dropped on the left to fit max_position_embeddings
} BenchScores;

typedef struct BenchScorer BenchScorer;

// full_forward 0: through the decoder with the codecs of layout; 1: the full-sequence forward
// with each codec's round trip applied where the cache holds the value (the check path).
// The model is switched to inference with layout's codecs for the scorer's life (the decoder's
// prefill runs the full forward with the model's codecs: they must be the layout's).
BenchScorer *bench_scorer_new(Model *m, const CacheLayout *layout, const Tokenizer *tok, int full_forward);
void bench_scorer_free(BenchScorer *s);
// Whether item it with prompt context `prompt` (from bench_prompt) can be scored, before any
// forward: 0, or -1 with one line in err (a continuation longer than the model's context, a
// context with no token and no <|endoftext|> to stand in for it).
int bench_check_item(BenchScorer *s, const BenchItem *it, const char *prompt, char *err, size_t errlen);
// Scores item it with prompt context `prompt` (from bench_prompt). Returns 0, or -1 with one line
// in err (bench_check_item's).
int bench_score_item(BenchScorer *s, const BenchItem *it, const char *prompt, BenchScores *out, char *err, size_t errlen);
// The same for n items at once, their choices (at most BENCH_BATCH_SEQS in all) prefilled together
// and decoded side by side. On an error *bad (may be NULL) is the index of the item it names.
// A sequence's numbers can change in the last bits with the batch it runs in (the matmuls take
// other paths for other row counts): callers that must agree across runs form the same batches.
int bench_score_batch(BenchScorer *s, int n, const BenchItem *const *items, char *const *prompts, BenchScores *outs, int *bad,
                      char *err, size_t errlen);
// Seconds spent in model forwards (prefill, steps, full forwards) so far.
double bench_scorer_forward_seconds(const BenchScorer *s);

// The index with the highest score (loglik, or loglik / bytes when norm), the lowest on ties.
int bench_pick(const BenchScores *sc, int norm);

typedef struct BenchTotals {
    long long n, correct, correct_norm;
} BenchTotals;
void bench_totals_add(BenchTotals *t, const BenchScores *sc, int label);
// Accuracy and its standard error sqrt(p (1 - p) / (n - 1)) (NaN when n < 2).
void bench_accuracy(long long correct, long long n, double *acc, double *stderr_out);

#endif
