#!/usr/bin/python3
"""Converts public multiple-choice benchmark files into the generic JSONL that `clla eval --bench`
reads (docs/BENCHMARKS.md): one object per line with "context", "choices", "label" and, where the
format has them, "split" ("dev" for few-shot examples), "fewshot" (the few-shot pool: the subject),
"header" (text before the few-shot examples) and "continuation" (partial scoring).

usage: convert_bench.py FORMAT --out OUT.jsonl [--labels FILE] INPUT...

FORMAT     input
mmlu       MMLU CSV without a header row: question,A,B,C,D,answer (A-D); the subject and split come
           from the file name: <subject>_dev.csv (few-shot), <subject>_test.csv or _val.csv (scored)
cmmlu      CMMLU CSV with a header row: ,Question,A,B,C,D,Answer; <dir>/dev/<subject>.csv is the few-shot
           split, any other folder scored
ceval      C-Eval CSV with a header row: id,question,A,B,C,D,answer[,explanation]; <subject>_dev.csv
           few-shot, <subject>_val.csv scored (the test split has no answers)
arc        ARC JSONL: {"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"} (the AI2
           release) or {"question", "choices": {"text": [], "label": []}, "answerKey"}; labels A-E or 1-5
piqa       PIQA JSONL {"goal", "sol1", "sol2"} with --labels (one 0 or 1 a line)
siqa       Social IQa JSONL {"context", "question", "answerA", "answerB", "answerC"} with --labels
           (one 1, 2 or 3 a line)
winogrande Winogrande JSONL {"sentence" with one "_", "option1", "option2", "answer": "1"|"2"}:
           partial scoring, the option fills the blank and the shared rest of the sentence is scored
boolq      BoolQ JSONL {"question", "passage", "answer": true|false} (or "label": 0|1, 1 = yes)
hellaswag  HellaSwag JSONL {"ctx", "endings", "label"} (clla reads it as is; this writes it generic)

Standard library only (Debian's /usr/bin/python3). A bad input line stops the conversion with one
line naming the file and line; the output is written to a temporary and renamed, so it is complete
or absent.
"""
import argparse
import csv
import json
import os
import re
import sys

LETTERS = "ABCDE"


class BadInput(Exception):
    pass


def where(path, line):
    return f"{path}:{line}"


def read_jsonl(path):
    """(line number, object) for every non-blank line."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInput(f"{where(path, n)}: not JSON ({e.msg} at column {e.colno})")
            if not isinstance(obj, dict):
                raise BadInput(f"{where(path, n)}: not a JSON object")
            yield n, obj


def need(obj, key, path, n, kind=str):
    if key not in obj:
        raise BadInput(f"{where(path, n)}: no \"{key}\"")
    v = obj[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise BadInput(f"{where(path, n)}: \"{key}\" must be a {kind.__name__}")
    return v


def read_labels(path, count, valid):
    if not path:
        raise BadInput("this format keeps its labels in a separate file: pass --labels FILE")
    with open(path, encoding="utf-8") as f:
        labels = [ln.strip() for ln in f if ln.strip()]
    if len(labels) != count:
        raise BadInput(f"{path}: {len(labels)} labels for {count} items: pass the labels file of this split")
    for i, lab in enumerate(labels, 1):
        if lab not in valid:
            raise BadInput(f"{where(path, i)}: label '{lab}' is not one of {', '.join(valid)}")
    return labels


# ----------------------------------------------------------------------------- subject CSVs

def subject_of(path):
    name = os.path.splitext(os.path.basename(path))[0]
    return re.sub(r"_(dev|test|val)$", "", name)


def mc_item(q, opts, answer, header, subject, split, path, n, answer_prefix):
    if answer not in LETTERS[:len(opts)]:
        raise BadInput(f"{where(path, n)}: answer '{answer}' is not one of {', '.join(LETTERS[:len(opts)])}")
    for letter, o in zip(LETTERS, opts):
        if not o.strip():
            raise BadInput(f"{where(path, n)}: option {letter} is empty")
    body = q.strip() + "\n" + "".join(f"{letter}. {o.strip()}\n" for letter, o in zip(LETTERS, opts))
    item = {"context": body + answer_prefix, "choices": [f" {letter}" for letter in LETTERS[:len(opts)]],
            "label": LETTERS.index(answer), "header": header, "fewshot": subject}
    if split == "dev":
        item["split"] = "dev"
    return item


def read_csv_rows(path, header_cols):
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f))
    start = 0
    if header_cols is not None:
        if not rows or [c.strip().lower() for c in rows[0]][:len(header_cols)] != header_cols:
            raise BadInput(f"{path}:1: expected the header row {','.join(header_cols)}")
        start = 1
    return [(i + 1, r) for i, r in enumerate(rows) if i >= start and any(c.strip() for c in r)]


def convert_mmlu(paths, args):
    for path in paths:
        subject = subject_of(path)
        split = "dev" if os.path.basename(path).endswith("_dev.csv") else "test"
        header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        for n, r in read_csv_rows(path, None):
            if len(r) != 6:
                raise BadInput(f"{where(path, n)}: {len(r)} columns, MMLU rows have 6 (question, A, B, C, D, answer)")
            yield mc_item(r[0], r[1:5], r[5].strip(), header, subject, split, path, n, "Answer:")


def convert_cmmlu(paths, args):
    for path in paths:
        subject = subject_of(path)
        split = "dev" if os.path.basename(os.path.dirname(os.path.abspath(path))) == "dev" else "test"
        header = f"以下是关于{subject.replace('_', ' ')}的单项选择题，请直接给出正确答案的选项。\n\n"
        for n, r in read_csv_rows(path, ["", "question", "a", "b", "c", "d", "answer"]):
            if len(r) != 7:
                raise BadInput(f"{where(path, n)}: {len(r)} columns, CMMLU rows have 7 (index, Question, A, B, C, D, Answer)")
            yield mc_item(r[1], r[2:6], r[6].strip(), header, subject, split, path, n, "答案：")


def convert_ceval(paths, args):
    for path in paths:
        subject = subject_of(path)
        split = "dev" if os.path.basename(path).endswith("_dev.csv") else "test"
        header = f"以下是中国关于{subject.replace('_', ' ')}考试的单项选择题，请选出其中的正确答案。\n\n"
        for n, r in read_csv_rows(path, ["id", "question", "a", "b", "c", "d", "answer"]):
            if len(r) < 7:
                raise BadInput(f"{where(path, n)}: {len(r)} columns, C-Eval rows have 7 or 8 (id, question, A, B, C, D, answer[, explanation])")
            if not r[6].strip():
                raise BadInput(f"{where(path, n)}: no answer (C-Eval's test split has none: convert the val split)")
            yield mc_item(r[1], r[2:6], r[6].strip(), header, subject, split, path, n, "答案：")


# ----------------------------------------------------------------------------- JSONL formats

def convert_arc(paths, args):
    for path in paths:
        for n, o in read_jsonl(path):
            q = o.get("question")
            if isinstance(q, dict):          # the AI2 release
                stem = need(q, "stem", path, n)
                ch = need(q, "choices", path, n, list)
                texts = [need(c, "text", path, n) if isinstance(c, dict) else None for c in ch]
                labels = [str(need(c, "label", path, n)) if isinstance(c, dict) else None for c in ch]
                if None in texts:
                    raise BadInput(f"{where(path, n)}: \"question.choices\" entries must be objects with text and label")
            else:                             # the HF layout
                stem = need(o, "question", path, n)
                ch = need(o, "choices", path, n, dict)
                texts, labels = ch.get("text"), ch.get("label")
                if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
                    raise BadInput(f"{where(path, n)}: \"choices\" needs equal-length \"text\" and \"label\" lists")
                labels = [str(x) for x in labels]
            key = str(need(o, "answerKey", path, n))
            if key not in labels:
                raise BadInput(f"{where(path, n)}: answerKey '{key}' is not among the labels {labels}")
            for lab in labels:
                if lab not in "ABCDE12345" or len(lab) != 1:
                    raise BadInput(f"{where(path, n)}: choice label '{lab}' is not A-E or 1-5")
            yield {"context": f"Question: {stem.strip()}\nAnswer:", "choices": [" " + t.strip() for t in texts],
                   "label": labels.index(key)}


def convert_piqa(paths, args):
    items = [(path, n, o) for path in paths for n, o in read_jsonl(path)]
    labels = read_labels(args.labels, len(items), ["0", "1"])
    for (path, n, o), lab in zip(items, labels):
        goal = need(o, "goal", path, n)
        yield {"context": f"Question: {goal.strip()}\nAnswer:",
               "choices": [" " + need(o, "sol1", path, n).strip(), " " + need(o, "sol2", path, n).strip()], "label": int(lab)}


def convert_siqa(paths, args):
    items = [(path, n, o) for path in paths for n, o in read_jsonl(path)]
    labels = read_labels(args.labels, len(items), ["1", "2", "3"])
    for (path, n, o), lab in zip(items, labels):
        ctx = f"Q: {need(o, 'context', path, n).strip()} {need(o, 'question', path, n).strip()}\nA:"
        yield {"context": ctx, "choices": [" " + need(o, k, path, n).strip() for k in ("answerA", "answerB", "answerC")],
               "label": int(lab) - 1}


def convert_winogrande(paths, args):
    for path in paths:
        for n, o in read_jsonl(path):
            s = need(o, "sentence", path, n)
            if s.count("_") != 1:
                raise BadInput(f"{where(path, n)}: the sentence needs exactly one '_' blank, it has {s.count('_')}")
            ans = str(need(o, "answer", path, n) if not isinstance(o.get("answer"), int) else o["answer"])
            if ans not in ("1", "2"):
                raise BadInput(f"{where(path, n)}: answer '{ans}' is not 1 or 2")
            i = s.index("_")
            rest = s[i + 1:].strip()
            if not rest:
                raise BadInput(f"{where(path, n)}: nothing follows the blank: partial scoring needs the rest of the sentence")
            # lm-evaluation-harness's partial scoring: the option completes the context, the
            # shared rest of the sentence is the scored continuation
            yield {"context": s[:i], "choices": [need(o, "option1", path, n), need(o, "option2", path, n)],
                   "continuation": " " + rest, "label": int(ans) - 1}


def convert_boolq(paths, args):
    for path in paths:
        for n, o in read_jsonl(path):
            if isinstance(o.get("answer"), bool):
                yes = o["answer"]
            elif o.get("label") in (0, 1) and not isinstance(o.get("label"), bool):
                yes = o["label"] == 1
            else:
                raise BadInput(f"{where(path, n)}: needs \"answer\": true|false (or \"label\": 0|1)")
            q = need(o, "question", path, n).strip()
            yield {"context": f"{need(o, 'passage', path, n).strip()}\nQuestion: {q}?\nAnswer:", "choices": [" no", " yes"],
                   "label": 1 if yes else 0}


def convert_hellaswag(paths, args):
    for path in paths:
        for n, o in read_jsonl(path):
            ends = need(o, "endings", path, n, list)
            lab = o.get("label")
            if isinstance(lab, str) and lab.isdigit():
                lab = int(lab)
            if not isinstance(lab, int) or isinstance(lab, bool) or not 0 <= lab < len(ends):
                raise BadInput(f"{where(path, n)}: label {lab!r} is not an index into the {len(ends)} endings")
            yield {"context": need(o, "ctx", path, n), "choices": [" " + e for e in ends], "label": lab}


CONVERTERS = {"mmlu": convert_mmlu, "cmmlu": convert_cmmlu, "ceval": convert_ceval, "arc": convert_arc,
              "piqa": convert_piqa, "siqa": convert_siqa, "winogrande": convert_winogrande, "boolq": convert_boolq,
              "hellaswag": convert_hellaswag}


def check_item(item, i):
    """The generic format's rules (eval/bench.c enforces the same): >= 2 non-empty choices, label in range."""
    ch = item["choices"]
    if len(ch) < 2 or any(not c for c in ch) or not 0 <= item["label"] < len(ch):
        raise BadInput(f"item {i}: {len(ch)} choices, label {item['label']}: an empty choice or a label out of range")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[4:]))
    p.add_argument("format", choices=sorted(CONVERTERS))
    p.add_argument("inputs", nargs="+", metavar="INPUT")
    p.add_argument("--out", required=True, help="the generic JSONL to write")
    p.add_argument("--labels", help="labels file (piqa, siqa)")
    a = p.parse_args(argv)
    tmp = f"{a.out}.tmp.{os.getpid()}"
    try:
        n = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for n, item in enumerate(CONVERTERS[a.format](a.inputs, a), 1):
                check_item(item, n)
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if n == 0:
            raise BadInput("the input holds no item")
        os.replace(tmp, a.out)
    except (BadInput, OSError, UnicodeDecodeError, csv.Error) as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        print(f"convert_bench.py: error: {e}", file=sys.stderr)
        return 1
    print(f"convert_bench.py: {n} items ({a.format}) -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
