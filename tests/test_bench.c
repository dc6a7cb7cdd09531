// The benchmark harness's pure parts (eval/bench.c): few-shot prompts never include the item
// being scored (nor a copy of it), come from the dev split of the item's group when there is
// one, repeat for a seed and change with it; too few examples for K shots is refused; the
// accuracy, its standard error and the byte-normalized pick match hand-computed values.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval/bench.h"

static int passed, failed;
static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ok ? passed++ : failed++;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) { perror(path); exit(1); }
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

// Every scored item of b with K shots, for several seeds: the item's context is in its prompt
// exactly once, at the end; every shot is an item of the pool (dev of the same group when the
// file has a dev split) and the prompt starts with the item's header.
static void check_prompts(const char *what, const Bench *b, int K) {
    int bad = 0, total = 0;
    char err[512];
    for (uint64_t seed = 0; seed < 20; seed++)
        for (int i = 0; i < b->n_items; i++) {
            const BenchItem *it = &b->items[i];
            if (it->dev) continue;
            char *p = bench_prompt(b, i, K, seed, err, sizeof(err));
            total++;
            if (!p) { printf("  item %d: %s\n", i, err); bad++; continue; }
            size_t pl = strlen(p), cl = strlen(it->context);
            int ok = count(p, it->context) == 1 && pl >= cl && !strcmp(p + pl - cl, it->context);
            if (it->header) ok = ok && !strncmp(p, it->header, strlen(it->header));
            int shots = 0;
            for (int j = 0; j < b->n_items; j++) {
                const BenchItem *o = &b->items[j];
                if (j == i || !strstr(p, o->context)) continue;
                shots++;
                int same_group = !strcmp(o->group ? o->group : "", it->group ? it->group : "");
                if (!same_group || (b->n_dev && !o->dev)) ok = 0;
                // a shot is its context, its right choice, a blank line
                const char *at = strstr(p, o->context) + strlen(o->context), *right = o->choices[o->label];
                if (strncmp(at, right, strlen(right)) || strncmp(at + strlen(right), "\n\n", 2)) ok = 0;
            }
            if (shots != K) ok = 0;
            if (!ok) { printf("  item %d seed %llu: prompt [%s]\n", i, (unsigned long long)seed, p); bad++; }
            free(p);
        }
    char msg[256];
    snprintf(msg, sizeof(msg), "%s: %d prompts of %d shots hold their item once, at the end, and %d pool examples (context + right choice)", what, total, K, K);
    check(bad == 0 && total > 0, msg);
}

int main(void) {
    char dir[] = "/tmp/clla_test_bench_XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char nodev[512], dev[512], dup[512];
    snprintf(nodev, sizeof(nodev), "%s/nodev.jsonl", dir);
    snprintf(dev, sizeof(dev), "%s/dev.jsonl", dir);
    snprintf(dup, sizeof(dup), "%s/dup.jsonl", dir);
    // no dev split: the pool is the other items (lm-evaluation-harness's rule)
    write_text(nodev,
               "{\"context\": \"q-alpha\", \"choices\": [\" a\", \" b\"], \"label\": 0}\n"
               "{\"context\": \"q-beta\", \"choices\": [\" a\", \" b\"], \"label\": 1}\n"
               "\n"
               "{\"context\": \"q-gamma\", \"choices\": [\" a\", \" b\"], \"label\": 0}\n"
               "{\"context\": \"q-delta\", \"choices\": [\" a\", \" b\"], \"label\": 1}\n"
               "{\"context\": \"q-epsilon\", \"choices\": [\" a\", \" b\"], \"label\": 0}\n");
    // a dev split in two groups with headers
    write_text(dev,
               "{\"context\": \"d-one\", \"choices\": [\" a\", \" b\"], \"label\": 0, \"split\": \"dev\", \"fewshot\": \"x\"}\n"
               "{\"context\": \"d-two\", \"choices\": [\" a\", \" b\"], \"label\": 1, \"split\": \"dev\", \"fewshot\": \"x\"}\n"
               "{\"context\": \"d-three\", \"choices\": [\" a\", \" b\"], \"label\": 1, \"split\": \"dev\", \"fewshot\": \"x\"}\n"
               "{\"context\": \"e-one\", \"choices\": [\" a\", \" b\"], \"label\": 0, \"split\": \"dev\", \"fewshot\": \"y\"}\n"
               "{\"context\": \"e-two\", \"choices\": [\" a\", \" b\"], \"label\": 0, \"split\": \"dev\", \"fewshot\": \"y\"}\n"
               "{\"context\": \"t-one\", \"choices\": [\" a\", \" b\"], \"label\": 0, \"fewshot\": \"x\", \"header\": \"About x.\\n\\n\"}\n"
               "{\"context\": \"t-two\", \"choices\": [\" a\", \" b\"], \"label\": 1, \"fewshot\": \"y\", \"header\": \"About y.\\n\\n\"}\n"
               "{\"context\": \"t-three\", \"choices\": [\" a\", \" b\"], \"label\": 1, \"fewshot\": \"x\", \"split\": \"test\"}\n");
    // the scored item also sits in the dev split: it must not be its own example
    write_text(dup,
               "{\"context\": \"same\", \"choices\": [\" a\", \" b\"], \"label\": 0, \"split\": \"dev\"}\n"
               "{\"context\": \"other\", \"choices\": [\" a\", \" b\"], \"label\": 0, \"split\": \"dev\"}\n"
               "{\"context\": \"same\", \"choices\": [\" a\", \" b\"], \"label\": 0}\n");
    Bench b;
    char err[512];
    check(bench_load(&b, nodev, 0, err, sizeof(err)) == 0 && b.n_items == 5 && b.n_dev == 0 && b.items[3].line == 5,
          "a generic file loads (5 items, blank line skipped, line numbers kept)");
    check_prompts("no dev split, 4 shots", &b, 4);
    check_prompts("no dev split, 2 shots", &b, 2);
    char *p = bench_prompt(&b, 0, 5, 1, err, sizeof(err));
    check(!p && strstr(err, "--shots 5"), "5 shots from a pool of 4 other items is refused");
    printf("     (%s)\n", err);
    free(p);
    char *a1 = bench_prompt(&b, 1, 2, 7, err, sizeof(err)), *a2 = bench_prompt(&b, 1, 2, 7, err, sizeof(err));
    int differs = 0;
    for (uint64_t s = 8; s < 40 && !differs; s++) {
        char *a3 = bench_prompt(&b, 1, 2, s, err, sizeof(err));
        differs = strcmp(a1, a3) != 0;
        free(a3);
    }
    check(a1 && a2 && !strcmp(a1, a2) && differs, "a seed repeats its shots; other seeds draw others");
    free(a1);
    free(a2);
    bench_free(&b);

    check(bench_load(&b, dev, 0, err, sizeof(err)) == 0 && b.n_dev == 5, "a file with a dev split in two groups loads");
    check_prompts("dev split by group, 2 shots", &b, 2);
    p = bench_prompt(&b, 6, 3, 1, err, sizeof(err));
    check(!p && strstr(err, "group y"), "3 shots from group y's 2 dev items is refused");
    printf("     (%s)\n", err);
    p = bench_prompt(&b, 5, 3, 1, err, sizeof(err));
    check(p && !strncmp(p, "About x.\n\n", 10) && count(p, "d-") == 3 && count(p, "e-") == 0, "the header leads, the shots are group x's");
    free(p);
    bench_free(&b);

    check(bench_load(&b, dup, 0, err, sizeof(err)) == 0, "a file whose scored item is also a dev item loads");
    p = bench_prompt(&b, 2, 1, 3, err, sizeof(err));
    check(p && count(p, "same") == 1 && strstr(p, "other"), "a dev copy of the scored item is never its example");
    free(p);
    p = bench_prompt(&b, 2, 2, 3, err, sizeof(err));
    check(!p, "so 2 shots from that dev split (1 usable) is refused");
    free(p);
    bench_free(&b);

    // picks and statistics by hand
    BenchScores sc = {.n_choices = 3, .loglik = {-4.0, -6.0, -9.0}, .bytes = {2, 6, 10}};
    check(bench_pick(&sc, 0) == 0 && bench_pick(&sc, 1) == 2, "acc picks the largest sum (-4), acc_norm the largest per byte (-0.9)");
    BenchScores tie = {.n_choices = 2, .loglik = {-3.0, -3.0}, .bytes = {3, 3}};
    check(bench_pick(&tie, 0) == 0 && bench_pick(&tie, 1) == 0, "ties go to the lower index");
    BenchTotals t = {0};
    bench_totals_add(&t, &sc, 2);
    bench_totals_add(&t, &sc, 0);
    bench_totals_add(&t, &tie, 0);
    bench_totals_add(&t, &tie, 1);
    double acc, se;
    bench_accuracy(t.correct, t.n, &acc, &se);
    check(t.n == 4 && t.correct == 2 && fabs(acc - 0.5) < 1e-15 && fabs(se - sqrt(0.25 / 3)) < 1e-15,
          "acc 2/4 with stderr sqrt(0.5 * 0.5 / 3)");
    bench_accuracy(t.correct_norm, t.n, &acc, &se);
    check(t.correct_norm == 2 && fabs(acc - 0.5) < 1e-15, "acc_norm 2/4");
    bench_accuracy(1, 1, &acc, &se);
    check(acc == 1 && isnan(se), "one item: no standard error (NaN)");

    remove(nodev);
    remove(dev);
    remove(dup);
    rmdir(dir);
    printf("test_bench: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
