#!/usr/bin/python3
"""Builds the benchmark the project ships (docs/BENCHMARKS.md, "The shipped benchmark"): "which of
four candidate sentences comes next after this passage", from the held-out (validation) documents
of a built-in corpus, in the generic JSONL of `clla eval --bench`.

usage: make_heldout_bench.py --corpus data_cache/corpus/english.jsonl --lang en --out eval/benchmarks/heldout_en.jsonl

Held out means what `clla prep` puts in its validation split (cli/cmd_prep.c, is_val): a document
goes there when mix64(fnv1a64(its text's UTF-8 bytes) ^ mix64(split seed)) / 2^64 falls under the
validation fraction (prep's defaults: 0.02 and seed 0, the same defaults here). So a model trained
on `clla prep`'s train split with those settings has never seen any passage, answer or distractor.

Per held-out document (in file order): its text is cut into sentences; up to --per-doc positions are
drawn where a passage of 1 to 4 sentences (--max-context-bytes at most) is followed by a sentence
of a usable length: that sentence is the right choice. Three distractors are sentences of other
held-out documents whose length is within a factor 2 of the right one. The four are shuffled. The
first --dev items are the few-shot split ("split": "dev"). Everything is drawn from one
random.Random(seed): the output is the same bytes for the same corpus and settings.

Standard library only (Debian's /usr/bin/python3).
"""
import argparse
import json
import os
import random
import re
import sys

MASK = (1 << 64) - 1


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & MASK
    return h


def mix64(x):
    """splitmix64's finalizer, as data/bytes.h mix64."""
    x = (x + 0x9e3779b97f4a7c15) & MASK
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & MASK
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & MASK
    return x ^ (x >> 31)


def is_val(text_bytes, val_fraction, split_seed):
    """cli/cmd_prep.c is_val: the document's bytes and the split seed decide, nothing else."""
    h = mix64(fnv1a64(text_bytes) ^ mix64(split_seed))
    return (h >> 11) * (1.0 / 9007199254740992.0) < val_fraction


def held_out(path, key, val_fraction, split_seed):
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)[key]
                b = text.encode("utf-8")
            except (json.JSONDecodeError, KeyError, TypeError, UnicodeEncodeError) as e:
                raise ValueError(f"{path}:{n}: not a document with a \"{key}\" string ({e})")
            if is_val(b, val_fraction, split_seed):
                docs.append(text)
    return docs


CJK = "\u3000-\u303f\u3400-\u9fff\uff00-\uffef"


def sentences(text, lang):
    if lang == "zh":
        # the Chinese corpus wraps lines inside sentences: join them
        t = re.sub(rf"(?<=[{CJK}])\s*\n\s*(?=[{CJK}])", "", text)
        t = re.sub(r"\s+", " ", t).strip()
        parts = re.split(r"(?<=[。！？!?])", t)
    else:
        t = re.sub(r"\s+", " ", text).strip()
        parts = re.split(r"(?<=[.!?])\s+(?=[\"'A-Z0-9(])", t)
    return [p.strip() for p in parts if p.strip()]


def usable(s, lang):
    n = len(s.encode("utf-8"))
    lo, hi = (24, 240) if lang == "en" else (18, 300)
    return lo <= n <= hi


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    p.add_argument("--corpus", required=True, help="a JSONL corpus (data_cache/corpus/english.jsonl, chinese.jsonl)")
    p.add_argument("--lang", required=True, choices=["en", "zh"])
    p.add_argument("--out", required=True)
    p.add_argument("--text-key", default="text")
    p.add_argument("--val-fraction", type=float, default=0.02, help="clla prep's --val-fraction (default 0.02)")
    p.add_argument("--split-seed", type=int, default=0, help="clla prep's --split-seed (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-doc", type=int, default=2, help="items per document at most (default 2)")
    p.add_argument("--max-items", type=int, default=400)
    p.add_argument("--dev", type=int, default=10, help="the first N items are the few-shot split (default 10)")
    p.add_argument("--max-context-bytes", type=int, default=600)
    p.add_argument("--docs-out", help="also write the held-out documents as JSONL (to check them against clla prep's val split)")
    a = p.parse_args(argv)
    try:
        if not 0 <= a.val_fraction < 1:
            raise ValueError(f"--val-fraction {a.val_fraction} is out of range: use 0 <= F < 1, as clla prep")
        docs = held_out(a.corpus, a.text_key, a.val_fraction, a.split_seed)
        if a.docs_out:
            with open(a.docs_out, "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps({a.text_key: d}, ensure_ascii=False) + "\n")
        rng = random.Random(a.seed)
        sents = [sentences(d, a.lang) for d in docs]
        pool = [(i, s) for i, ss in enumerate(sents) for s in ss if usable(s, a.lang)]
        items = []
        for i, ss in enumerate(sents):
            # positions k: sentence k is the answer, a passage of 1-4 sentences before it
            cand = [k for k in range(1, len(ss)) if usable(ss[k], a.lang)]
            rng.shuffle(cand)
            made = 0
            for k in cand:
                if made == a.per_doc or len(items) == a.max_items:
                    break
                start = max(0, k - rng.randint(1, 4))
                sep = " " if a.lang == "en" else ""
                while start < k - 1 and len(sep.join(ss[start:k]).encode("utf-8")) > a.max_context_bytes:
                    start += 1
                context = sep.join(ss[start:k])
                if len(context.encode("utf-8")) > a.max_context_bytes:
                    continue
                right = ss[k]
                n = len(right.encode("utf-8"))
                others = [s for j, s in pool if j != i and n / 2 <= len(s.encode("utf-8")) <= 2 * n and s != right]
                if len(set(others)) < 3:
                    continue
                wrong = rng.sample(sorted(set(others)), 3)
                choices = [right] + wrong
                rng.shuffle(choices)
                item = {"context": context, "choices": [sep + c for c in choices], "label": choices.index(right)}
                if len(items) < a.dev:
                    item["split"] = "dev"
                items.append(item)
                made += 1
        if len(items) <= a.dev:
            raise ValueError(f"{len(docs)} held-out documents gave {len(items)} items: raise --val-fraction or use a larger corpus")
        tmp = f"{a.out}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for it in items:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, a.out)
    except (ValueError, OSError) as e:
        print(f"make_heldout_bench.py: error: {e}", file=sys.stderr)
        return 1
    print(f"make_heldout_bench.py: {len(docs)} held-out documents -> {len(items)} items ({min(a.dev, len(items))} dev) in {a.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
