// Unit tests of the pieces under the strict config reading (issue 12): the number parsers
// (common/num.c), checked arithmetic, the strict JSON reader (common/json_strict.c), the
// "did you mean" (model/config_hf.c), the MemAvailable parser (model/mem_plan.c) and the
// hashed tensor table (model/tensor_table.c). tests/test_config_strict.sh covers the binary.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_strict.h"
#include "common/num.h"
#include "model/config_hf.h"
#include "model/mem_plan.h"
#include "model/moe.h"
#include "model/tensor_table.h"
#include "tests/lib/check.h"


static void test_integers(void) {
    static const struct { const char *s; int rc; int64_t v; } I[] = {
        {"0", NUM_OK, 0}, {"42", NUM_OK, 42}, {"-7", NUM_OK, -7},
        {"9223372036854775807", NUM_OK, INT64_MAX}, {"-9223372036854775808", NUM_OK, INT64_MIN},
        {"9223372036854775808", NUM_RANGE, 0}, {"-9223372036854775809", NUM_RANGE, 0},
        {"99999999999999999999999", NUM_RANGE, 0},
        {"", NUM_SYNTAX, 0}, {"-", NUM_SYNTAX, 0}, {"64k", NUM_SYNTAX, 0}, {"0x40", NUM_SYNTAX, 0},
        {"4abc", NUM_SYNTAX, 0}, {" 4", NUM_SYNTAX, 0}, {"4 ", NUM_SYNTAX, 0}, {"+4", NUM_SYNTAX, 0},
        {"1e3", NUM_SYNTAX, 0}, {"3.0", NUM_SYNTAX, 0}, {"--4", NUM_SYNTAX, 0},
    };
    for (size_t i = 0; i < sizeof(I) / sizeof(I[0]); i++) {
        int64_t v = 12345;
        int rc = num_parse_i64(I[i].s, INT64_MIN, INT64_MAX, &v);
        CHECK(rc == I[i].rc, "num_parse_i64(\"%s\") = %d, want %d", I[i].s, rc, I[i].rc);
        if (rc == NUM_OK) CHECK(v == I[i].v, "num_parse_i64(\"%s\") gave %lld", I[i].s, (long long)v);
        else CHECK(v == 12345, "num_parse_i64(\"%s\") wrote the output on failure", I[i].s);
    }
    int64_t v;
    CHECK(num_parse_i64("4294967328", INT32_MIN, INT32_MAX, &v) == NUM_RANGE, "an int option takes 2^32 + 32");
    CHECK(num_parse_i64("0", 1, 10, &v) == NUM_RANGE, "below the range");
    uint64_t u;
    CHECK(num_parse_u64("18446744073709551615", UINT64_MAX, &u) == NUM_OK && u == UINT64_MAX, "UINT64_MAX");
    CHECK(num_parse_u64("18446744073709551616", UINT64_MAX, &u) == NUM_RANGE, "2^64");
    CHECK(num_parse_u64("-1", UINT64_MAX, &u) == NUM_SYNTAX, "a sign on an unsigned number");
}

static void test_floats(void) {
    static const struct { const char *s; int rc; double v; } F[] = {
        {"0", NUM_OK, 0}, {"3e-3", NUM_OK, 3e-3}, {"-1.5E+2", NUM_OK, -150}, {"0.02", NUM_OK, 0.02},
        {"1e-400", NUM_OK, 0},   // underflows to zero: finite, kept
        {"1e999", NUM_RANGE, 0}, {"-1e999", NUM_RANGE, 0},
        {"nan", NUM_SYNTAX, 0}, {"inf", NUM_SYNTAX, 0}, {"infinity", NUM_SYNTAX, 0}, {"0x1p3", NUM_SYNTAX, 0},
        {"3e-3,", NUM_SYNTAX, 0}, {".5", NUM_SYNTAX, 0}, {"5.", NUM_SYNTAX, 0}, {"1e", NUM_SYNTAX, 0},
        {"", NUM_SYNTAX, 0}, {" 1", NUM_SYNTAX, 0}, {"+1", NUM_SYNTAX, 0}, {"01", NUM_SYNTAX, 0},
    };
    for (size_t i = 0; i < sizeof(F) / sizeof(F[0]); i++) {
        double v = 7;
        int rc = num_parse_f64(F[i].s, &v);
        CHECK(rc == F[i].rc, "num_parse_f64(\"%s\") = %d, want %d", F[i].s, rc, F[i].rc);
        if (rc == NUM_OK) CHECK(v == F[i].v, "num_parse_f64(\"%s\") gave %g", F[i].s, v);
    }
    int64_t x;
    CHECK(num_f64_to_i64(64.0, 0, 100, &x) == NUM_OK && x == 64, "64.0 is whole");
    CHECK(num_f64_to_i64(32.5, 0, 100, &x) == NUM_SYNTAX, "32.5 is not whole");
    CHECK(num_f64_to_i64(9007199254740992.0, 0, INT64_MAX, &x) == NUM_OK, "2^53 is exact");
    CHECK(num_f64_to_i64(18014398509481984.0, 0, INT64_MAX, &x) == NUM_RANGE, "2^54 is refused (not exact in JSON)");
    CHECK(num_f64_to_i64(1.0 / 0.0, 0, INT64_MAX, &x) == NUM_RANGE, "inf");
    CHECK(num_f64_to_i64(4294967328.0, INT32_MIN, INT32_MAX, &x) == NUM_RANGE, "2^32 + 32 for an int key");
}

static void test_checked(void) {
    int64_t r = 5;
    CHECK(ck_mul(INT64_MAX / 2, 2, &r) == 0 && r == INT64_MAX - 1, "a product that fits");
    r = 5;
    CHECK(ck_mul(134217728LL * 1908874350LL * 18, 20, &r) == -1 && r == 5, "the issue's 4.6e18 parameters x 20 bytes overflow, r untouched");
    CHECK(ck_add(INT64_MAX, 1, &r) == -1, "sum overflow");
    CHECK(ck_add(INT64_MAX - 1, 1, &r) == 0 && r == INT64_MAX, "sum that fits");
}

static void test_json(void) {
    char err[256];
    struct { const char *text; const char *want; } bad[] = {
        {"{\"a\": 1, \"a\": 2}", "line 1, column 10: duplicate key 'a'"},
        {"{\"t\": {\"x\": 1,\n \"x\": 2}}", "line 2, column 2: duplicate key 'x'"},
        {"[{\"k\": 1, \"k\": 1}]", "duplicate key 'k'"},
        {"{\"a\": 1}\n}", "line 2, column 1: text after the end"},
        {"{\"a\": 1} x", "line 1, column 10: text after the end"},
        {"{\"a\": 1,\n \"b\": }", "line 2, column 7: JSON syntax error"},
        {"{\"a\": 64k}", "line 1, column 9: JSON syntax error"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        cJSON *j = json_parse_strict(bad[i].text, strlen(bad[i].text), err, sizeof(err));
        CHECK(!j && strstr(err, bad[i].want), "json_parse_strict(%s): \"%s\", want \"%s\"", bad[i].text, err, bad[i].want);
        cJSON_Delete(j);
    }
    char deep[2200 + 16];
    size_t n = 0;
    for (int i = 0; i < 1001; i++) deep[n++] = '[';
    for (int i = 0; i < 1001; i++) deep[n++] = ']';
    deep[n] = 0;
    cJSON *j = json_parse_strict(deep, n, err, sizeof(err));
    CHECK(!j && strstr(err, "nested deeper than the 1000 levels"), "too deep: \"%s\"", err);
    const char nul[] = "{\"a\": 1}\0{}";
    j = json_parse_strict(nul, sizeof(nul) - 1, err, sizeof(err));
    CHECK(!j && strstr(err, "NUL byte"), "a NUL byte: \"%s\"", err);
    const char *good = "{\"a\": 1, \"b\": {\"a\": 2}, \"c\": [{\"a\": 1}, {\"a\": 2}]}  \n";
    j = json_parse_strict(good, strlen(good), err, sizeof(err));
    CHECK(j != NULL, "the same key in different objects is fine: %s", err);
    cJSON_Delete(j);
}

static void test_closest(void) {
    const char *keys[] = {"hidden_size", "head_dim", "num_hidden_layers", "warmup_steps", "lr"};
    CHECK(config_closest("hidden_sise", keys, 5) && !strcmp(config_closest("hidden_sise", keys, 5), "hidden_size"), "hidden_sise");
    CHECK(config_closest("num_hiden_layers", keys, 5) != NULL, "num_hiden_layers");
    CHECK(config_closest("frobnicate", keys, 5) == NULL, "far from every key");
    CHECK(config_closest("xy", keys, 5) == NULL, "two letters are not a typo of lr");
}

static void test_meminfo(void) {
    const char *t = "MemTotal:       24000000 kB\nMemFree:        20000000 kB\nMemAvailable:   23000000 kB\n";
    CHECK(mem_parse_meminfo(t) == 23000000ull * 1024, "MemAvailable");
    CHECK(mem_parse_meminfo("MemTotal: 5 kB\n") == 0, "no MemAvailable");
}

static void test_table(void) {
    TensorTable tt = {0};
    int64_t shape[2] = {3, 5};
    char name[64];
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof(name), "model.layers.%d.w", i);
        CHECK(table_add(&tt, name, i, 1, DT_STORE, 2, shape) == i, "index of %s", name);
    }
    int bad = 0;
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof(name), "model.layers.%d.w", i);
        bad += table_find(&tt, name) != i;
    }
    CHECK(bad == 0, "%d of 20000 names found at the wrong index", bad);
    CHECK(table_find(&tt, "model.layers.20000.w") == -1 && table_find(&tt, "") == -1, "absent names");
    CHECK(tt.numel == 20000 * 15, "total elements %zu", tt.numel);
    table_layout(&tt, 2);
    CHECK(tt.t[1].off_store == 256 && tt.t[1].off_f32 == 256 && tt.bytes_store == 20000 * 256, "256-byte aligned layout");
    table_free(&tt);

    // a joined tensor starts where the one before it ends (gate_proj | up_proj), in both
    // layouts, and a plan-only table counts the same bytes
    TensorTable full = {0}, plan = {.plan_store_bytes = 2};
    TensorTable *both[2] = {&full, &plan};
    for (int k = 0; k < 2; k++) {
        table_add(both[k], "a", 0, 1, DT_STORE, 2, shape);
        table_join_next(both[k]);
        table_add(both[k], "b", 0, 1, DT_STORE, 2, shape);
        table_add(both[k], "c", 0, 1, DT_STORE, 2, shape);
        table_join_next(both[k]);
        table_add(both[k], "d", 0, 1, DT_STORE, 2, shape);
    }
    table_layout(&full, 2);
    CHECK(full.t[1].off_store == 30 && full.t[1].off_f32 == 60, "joined: b at %zu / %zu, not right after a", full.t[1].off_store,
          full.t[1].off_f32);
    CHECK(full.t[2].off_store == 256 && full.t[3].off_store == 286 && full.t[3].off_f32 == 316, "after a joined pair: c at %zu, d at %zu",
          full.t[2].off_store, full.t[3].off_store);
    CHECK(full.bytes_store == 512 && full.bytes_f32 == 512, "joined layout totals %zu / %zu", full.bytes_store, full.bytes_f32);
    CHECK(plan.bytes_store == full.bytes_store && plan.bytes_f32 == full.bytes_f32, "plan-only totals %zu / %zu against %zu / %zu",
          plan.bytes_store, plan.bytes_f32, full.bytes_store, full.bytes_f32);
    table_free(&full);
    table_free(&plan);
}

// The expert capacity: ceil(N K / E * factor), at least 1, and at most N (an expert receives each
// token once, so N drops nothing; a factor of 1e30 converted to int was undefined behaviour).
static void test_moe_capacity(void) {
    ModelConfig c = {0};
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_capacity_factor = 1.5;
    CHECK(moe_capacity(&c, 100) == 38, "capacity(100 tokens, 2 of 8, 1.5) = %d, want ceil(37.5) = 38", moe_capacity(&c, 100));
    c.moe_capacity_factor = 1e-9;
    CHECK(moe_capacity(&c, 100) == 1, "a tiny factor gives capacity %d, want 1", moe_capacity(&c, 100));
    c.moe_capacity_factor = 1e30;
    CHECK(moe_capacity(&c, 100) == 100, "factor 1e30 gives capacity %d, want N = 100", moe_capacity(&c, 100));
    c.moe_capacity_factor = 0.0;
    CHECK(moe_capacity(&c, 100) == 0, "factor 0 (no dropping) gives capacity %d, want 0", moe_capacity(&c, 100));
    // the factor as a config gives it: 1.2 is 1.2, not its float rounding (1.2000000477), which
    // made ceil(40 / 4 * 1.2) 13 where Megatron's get_capacity gives 12
    Config cfg;
    config_from_json(&cfg,
                     "{\"vocab_size\":61,\"hidden_size\":24,\"num_attention_heads\":4,\"intermediate_size\":40,"
                     "\"num_hidden_layers\":1,\"attention\":\"mha\",\"n_routed_experts\":4,\"num_experts_per_tok\":1,"
                     "\"moe_intermediate_size\":10,\"moe_capacity_factor\":1.2}",
                     "capacity test", 0, NULL);
    CHECK(moe_capacity(&cfg.model, 40) == 12, "capacity(40 tokens, 1 of 4, 1.2) = %d, want 12", moe_capacity(&cfg.model, 40));
    CHECK(moe_capacity(&cfg.model, 100) == 30, "capacity(100 tokens, 1 of 4, 1.2) = %d, want 30", moe_capacity(&cfg.model, 100));
    cJSON *back = config_model_to_json(&cfg.model);
    char *text = cJSON_PrintUnformatted(back);
    CHECK(strstr(text, "\"moe_capacity_factor\":1.2,") != NULL, "the factor written back: %s", text);
    free(text);
    cJSON_Delete(back);
}

int main(void) {
    test_integers();
    test_moe_capacity();
    test_floats();
    test_checked();
    test_json();
    test_closest();
    test_meminfo();
    test_table();
    if (failures) { printf("%d checks failed\n", failures); return 1; }
    printf("all checks passed\n");
    return 0;
}
