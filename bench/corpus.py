"""A deterministic, realistic Home for benchmarks: no downloads, seeded `random`.

At scale 1.0 it writes, below the output folder:

- ``home/``: 10,000 markdown files, ~50 MB in all, in nested folders
  (projects, journal, areas, reading, archive...), with headings, paragraphs,
  bullet and numbered lists, code blocks, tables, quotes and links;
- ``agent/chats/<thread>.jsonl``: 2,000 conversations in Link's shape, one
  message a line, ``{"role", "text", "at", "from"}``, 5-60 messages each;
  ``agent/skills/`` (empty);
- ``queries.json``: 200 queries of 1-4 words mixing common words, rare
  technical terms and names, and phrases taken from the corpus;
- ``stamp.json``: what was generated (seed, scale, generator version, sizes);
  a later run with the same seed and scale reuses the folder as it is.

Words follow a Zipf-Mandelbrot law over a vocabulary of real English words
(the most frequent ranks) and English-looking made-up words (the long tail).
Rare technical terms, identifiers and people's names are sprinkled in at low
rates so that queries naming them are selective.

Run: ``python bench/corpus.py [OUT] [--scale 0.1] [--seed 7]`` (OUT: ``bench/out/local/``).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone

GENERATOR = "lnkmem-bench-corpus-3"
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "local")
FILES = 10_000
HOME_BYTES = 50_000_000
THREADS = 2_000
QUERIES = 200
AGENT_ID = "atlas"
OWNER = "sam"

# --- vocabulary ---------------------------------------------------------------

FUNCTION = """the of and to a in is that for it as was with be by on not he i this are or
his from at which but have an they you were her she there one all we their been has would
more if will what about up out them so can who when into some could these then other than its
only do my also did new just any may over after most should such where through while our your
must those because each very much before between both under same however still here again
now even well off why how without during since within upon whether although""".split()

CONTENT = """time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour
game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education foot boy age
policy process music market sense nation plan college interest death experience effect use
class control care field development role effort rate heart drug show leader light voice wife
police mind price report decision son view relationship town road arm difference value
building action model season society tax director position player record paper space ground
form event official matter center couple site project activity star table need court oil
situation cost industry figure street image phone data picture practice piece land product
doctor wall patient worker news test movie north love support technology step baby computer
type attention film tree source organization hair window evidence population site truth
network server client request response memory index search query file folder document note
release version feature design review meeting deadline budget schedule customer contract
invoice account password login session token cache storage database table column schema
migration backup deploy pipeline build test suite coverage bug issue ticket sprint roadmap
milestone launch metric dashboard alert incident outage latency throughput error warning log
trace span agent model prompt context window summary draft proposal outline chapter article
paper recipe garden kitchen travel flight hotel ticket museum concert weekend holiday
birthday gift dinner lunch breakfast coffee tea bread cheese apple orange lemon river
mountain forest lake beach island valley bridge tower harbor station village market square
theory method analysis experiment sample measure signal noise pattern structure function
variable constant parameter argument option setting config default limit threshold window
buffer stream queue worker thread lock mutex channel socket port address host domain route
path bucket object key secret certificate permission role policy user group owner admin
manager engineer designer writer editor reader author speaker guest host neighbor cousin
uncle aunt sister brother daughter grandmother grandfather teacher student coach captain
make know take see come think look want give find tell ask seem feel try leave call keep
provide hold turn follow begin bring show hear play run move like live believe happen write
sit stand lose pay meet include continue set learn lead understand watch stop create speak
read allow add spend grow open walk win offer remember consider appear buy wait serve die
send expect build stay fall cut reach kill remain suggest raise pass sell require decide
return explain hope develop carry break receive agree support hit produce eat cover catch
draw choose deploy fix merge ship refactor measure compare update upgrade install configure
debug profile monitor schedule cancel approve reject publish archive restore rotate renew
good new first last long great little own other old right big high different small large
next early young important few public bad same able late hard major better economic strong
possible whole free military true federal international full special easy clear recent
certain personal open red difficult available likely short single medical current wrong
private past foreign fine common poor natural significant similar hot dead central happy
serious ready simple left physical general environmental financial blue democratic dark
various entire close legal religious cold final main green nice huge popular traditional
cultural quick slow quiet bright heavy light fresh careful useful stable broken flaky
remote local global internal external manual automatic weekly daily monthly quarterly
annual urgent optional critical minor primary secondary temporary permanent""".split()

# Rare technical terms and names: each appears in few passages.
TECH = """kubelet etcd raft paxos memtable sstable fsync mmap epoll io_uring kqueue btree
lsm bloomfilter hyperloglog tombstone compaction wal checkpoint snapshotting backpressure
idempotency nonce hmac sha256 blake3 argon2 bcrypt x509 oauth oidc saml jwt mtls
grpc protobuf flatbuffers msgpack avro parquet arrow duckdb clickhouse postgres pgbouncer
sqlite lmdb rocksdb leveldb redis memcached kafka pulsar nats rabbitmq zookeeper consul
envoy istio linkerd nginx haproxy traefik terraform pulumi ansible helm kustomize argocd
prometheus grafana loki jaeger opentelemetry statsd sentry pagerduty opsgenie datadog
webassembly wasmtime llvm mlir cuda triton onnx tensorrt pytorch jax numpy scipy pandas
polars tokio asyncio uvloop gevent trio rustls openssl boringssl wireguard tailscale
bubblewrap seccomp cgroups namespaces overlayfs btrfs zfs ext4 xfs nvme raid10
tokenizer embedding reranker bm25 hnsw faiss ivfpq quantization distillation lora
backoff jitter debounce throttle sharding replication failover quorum linearizability
serializability mvcc deadlock livelock starvation heisenbug monorepo bazel buck2 nixos
flakehub cargo npm pnpm yarn vite esbuild webpack rollup tsc mypy ruff pytest hypothesis
""".split()

FIRST = """Amara Bjorn Chiara Dmitri Esperanza Farhan Giulia Hiroshi Ingrid Jamal Kalani
Leocadia Mateus Nnamdi Oksana Priya Quentin Rosalind Sebastiao Thandiwe Ulrich Valentina
Wojciech Xiomara Yusuf Zofia Anneliese Baptiste Cosima Desmond Eero Florentyna Gideon
Hafsa Isidore Joaquin Katarzyna Lorcan Mireille Nikolai Oluwaseun Pilar Radek Svetlana
Tobias Undine Vikram Wilhelmina Ximena Yevgenia Zoltan""".split()
LAST = """Okonkwo Vasquez Lindqvist Nakamura Abernathy Castellanos Delacroix Fitzgerald
Grünewald Haverkamp Iwasaki Jablonski Kowalczyk Lefebvre Montgomery Nieminen Oyelaran
Papadopoulos Quarshie Rautenberg Szymanski Thorvaldsen Underhill Vandermeer Wojcik
Yamamoto Zimmermann Achterberg Bellweather Coppersmith""".split()
CODENAMES = """Halcyon Bluefin Kestrel Marigold Obsidian Pangolin Quasar Saffron Tamarind
Umbra Verdigris Wisteria Zephyr Albatross Basilisk Cormorant Damask Ember Fennec Gossamer""".split()

ONSETS = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
          "b", "c", "d", "l", "m", "n", "p", "r", "s", "t", "br", "cr", "dr", "fl", "gr", "pl", "pr",
          "st", "tr", "sh", "ch", "th", "", ""]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ea", "ou", "ai"]
CODAS = ["", "", "", "", "n", "r", "l", "s", "t", "m", "nd", "st", "ck", "ng", "nt"]
SUFFIXES = ["", "", "", "er", "ing", "ed", "ly", "tion", "ment", "ness", "ous", "ive", "able", "ist", "ure"]


def _pseudo_words(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        k = rng.choice((1, 2, 2, 2, 2, 3))
        w = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(k))
        w += rng.choice(SUFFIXES)
        if 4 <= len(w) <= 12 and w not in taken:
            taken.add(w)
            out.append(w)
    return out


def _derived(words: list[str]) -> list[str]:
    """Inflections: plurals of nouns; -s, -ed, -ing of verbs; -ly of adjectives."""
    i_verb, i_adj = words.index("make"), words.index("good")
    out = []
    for i, w in enumerate(words):
        if i < i_verb:
            out.append(w + ("es" if w.endswith(("s", "sh", "ch", "x")) else "s"))
        elif i < i_adj:
            stem_ = w[:-1] if w.endswith("e") else w
            out += [w + ("es" if w.endswith(("s", "sh", "ch")) else "s"), stem_ + "ed", stem_ + "ing"]
        elif w.endswith(("al", "ful", "ent", "ant", "ic", "ous", "ive", "ar")):
            out.append(w + ("ally" if w.endswith("ic") else "ly"))
    return out


class Vocabulary:
    """Zipf-Mandelbrot sampling over real words then made-up ones."""

    def __init__(self, rng: random.Random, tail: int = 40_000, s: float = 1.1, q: float = 2.7,
                 tail_mass: float = 0.12):
        content = list(dict.fromkeys(CONTENT))
        derived = _derived(content)
        rng.shuffle(content)
        rng.shuffle(derived)
        taken = set(FUNCTION) | set(content) | set(derived)
        ranked = list(dict.fromkeys(FUNCTION + content[:300] + derived[:400] + content[300:] + derived[400:]))
        ranked += _pseudo_words(rng, tail, taken)
        self.words = ranked
        self.n_real = n_real = len(FUNCTION) + len(content) + len(derived)
        weights = [1.0 / (r + q) ** s for r in range(1, len(ranked) + 1)]
        head, rest = sum(weights[:n_real]), sum(weights[n_real:])
        k = tail_mass / (1 - tail_mass) * head / rest  # the made-up tail gets tail_mass of all words
        weights[n_real:] = [x * k for x in weights[n_real:]]
        self.cum = list(itertools.accumulate(weights))
        self.tech = TECH
        self.tech_cum = list(itertools.accumulate(1.0 / (r + 1.5) for r in range(1, len(TECH) + 1)))
        names = [f"{f} {l}" for f, l in zip(FIRST, itertools.cycle(LAST))]
        self.names = names + FIRST[:20]
        self.codenames = CODENAMES

    def sample(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=k)

    def rare(self, rng: random.Random) -> str:
        x = rng.random()
        if x < 0.55:
            return rng.choices(self.tech, cum_weights=self.tech_cum)[0]
        if x < 0.80:
            return rng.choice(self.names)
        if x < 0.90:
            return "Project " + rng.choice(self.codenames)
        if x < 0.95:
            return f"CVE-{rng.randint(2015, 2025)}-{rng.randint(1000, 49999)}"
        return f"{rng.choice(self.tech)}_{rng.choice(self.words[150:1200])}_{rng.choice(('ms', 'max', 'retry', 'v2', 'id'))}"


# --- text ----------------------------------------------------------------------


class Writer:
    def __init__(self, vocab: Vocabulary, rng: random.Random):
        self.v = vocab
        self.rng = rng
        self.phrases: list[str] = []

    def sentence(self, lo: int = 6, hi: int = 22) -> str:
        rng = self.rng
        words = self.v.sample(rng, rng.randint(lo, hi))
        if rng.random() < 0.16:
            words.insert(rng.randrange(len(words) + 1), self.v.rare(rng))
        if rng.random() < 0.004:
            start = rng.randrange(max(1, len(words) - 3))
            self.phrases.append(" ".join(words[start:start + rng.randint(2, 4)]))
        if rng.random() < 0.12 and len(words) > 6:
            i = rng.randrange(2, len(words) - 2)
            words[i] = words[i] + ","
        if rng.random() < 0.05:
            i = rng.randrange(len(words))
            words[i] = f"`{words[i]}`"
        if rng.random() < 0.03:
            i = rng.randrange(len(words) - 1)
            words[i] = f"[{words[i]} {words[i + 1]}](../{words[i]}.md)"
            del words[i + 1]
        s = " ".join(words)
        return s[:1].upper() + s[1:] + rng.choice(".....?!:")

    def paragraph(self) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(2, 8)))

    def title(self, lo: int = 2, hi: int = 6) -> str:
        words = self.v.sample(self.rng, self.rng.randint(lo, hi))
        if self.rng.random() < 0.25:
            words.append(self.v.rare(self.rng))
        return " ".join(w.capitalize() if i == 0 else w for i, w in enumerate(words))

    def ident(self) -> str:
        a, b = self.v.sample(self.rng, 2)
        return f"{a}_{b}".replace("'", "") if a.isalpha() and b.isalpha() else "value"

    def code(self) -> str:
        rng = self.rng
        lang = rng.choice(("python", "python", "bash", "go", "sql", "yaml", "json", ""))
        lines = []
        if lang == "sql":
            for _ in range(rng.randint(2, 8)):
                lines.append(f"SELECT {self.ident()}, count(*) FROM {self.ident()} WHERE {self.ident()} > {rng.randint(0, 999)} GROUP BY 1;")
        elif lang == "bash":
            for _ in range(rng.randint(2, 8)):
                lines.append(f"{rng.choice(('git', 'make', 'kubectl', 'curl', 'rg', 'ls'))} {self.ident()} --{self.ident().replace('_', '-')} {rng.randint(1, 99)}")
        elif lang in ("yaml", "json"):
            for _ in range(rng.randint(3, 12)):
                lines.append(f"  {self.ident()}: {rng.choice((str(rng.randint(0, 9999)), 'true', 'false', self.ident()))}")
        else:
            fn = self.ident()
            lines.append(f"def {fn}({self.ident()}, {self.ident()}=None):")
            for _ in range(rng.randint(2, 14)):
                kind = rng.random()
                if kind < 0.4:
                    lines.append(f"    {self.ident()} = {self.ident()}.{self.ident()}({rng.randint(0, 64)})")
                elif kind < 0.6:
                    lines.append(f"    if {self.ident()} is None:")
                    lines.append(f"        raise ValueError(\"{self.sentence(3, 8)}\")")
                elif kind < 0.8:
                    lines.append(f"    # {self.sentence(4, 12)}")
                else:
                    lines.append(f"    for {self.ident()} in {self.ident()}:")
                    lines.append(f"        yield {self.ident()}")
            lines.append(f"    return {self.ident()}")
        return f"```{lang}\n" + "\n".join(lines) + "\n```"

    def bullets(self, numbered: bool = False) -> str:
        n = self.rng.randint(2, 9)
        items = []
        for i in range(n):
            mark = f"{i + 1}." if numbered else self.rng.choice(("-", "-", "*"))
            body = self.sentence(3, 14)
            if self.rng.random() < 0.15:
                body = f"[{'x' if self.rng.random() < 0.5 else ' '}] " + body
            items.append(f"{mark} {body}")
        return "\n".join(items)

    def table(self) -> str:
        cols = self.rng.randint(2, 5)
        head = [self.title(1, 2) for _ in range(cols)]
        rows = ["| " + " | ".join(head) + " |", "|" + "---|" * cols]
        for _ in range(self.rng.randint(2, 10)):
            rows.append("| " + " | ".join(" ".join(self.v.sample(self.rng, self.rng.randint(1, 4))) for _ in range(cols)) + " |")
        return "\n".join(rows)

    def document(self, target: int) -> str:
        rng = self.rng
        blocks = [f"# {self.title()}"]
        if rng.random() < 0.3:
            blocks.append(f"Tags: {', '.join(self.v.sample(rng, rng.randint(1, 4)))}. Owner: {rng.choice(self.v.names)}.")
        size = len(blocks[0])
        while size < target:
            x = rng.random()
            if x < 0.10:
                b = f"{'#' * rng.choice((2, 2, 3, 4))} {self.title()}"
            elif x < 0.62:
                b = self.paragraph()
            elif x < 0.76:
                b = self.bullets()
            elif x < 0.81:
                b = self.bullets(numbered=True)
            elif x < 0.93:
                b = self.code()
            elif x < 0.97:
                b = self.table()
            else:
                b = "> " + self.paragraph()
            blocks.append(b)
            size += len(b) + 2
        return "\n\n".join(blocks) + "\n"

    def message(self, role: str) -> str:
        rng = self.rng
        if role == "user":
            return " ".join(self.sentence(4, 16) for _ in range(rng.randint(1, 3)))
        parts = [self.paragraph()]
        for _ in range(rng.randint(0, 3)):
            x = rng.random()
            parts.append(self.bullets() if x < 0.4 else self.code() if x < 0.6 else self.paragraph())
        return "\n\n".join(parts)


# --- layout --------------------------------------------------------------------

AREAS = ("projects", "journal", "areas", "reading", "archive", "inbox", "people", "recipes", "talks")


def _folders(vocab: Vocabulary, rng: random.Random, n: int) -> list[str]:
    out = [""]
    while len(out) < n:
        area = rng.choice(AREAS)
        if area == "journal":
            path = f"journal/{rng.randint(2019, 2025)}/{rng.randint(1, 12):02d}"
        elif area in ("projects", "archive"):
            proj = rng.choice(vocab.codenames).lower() if rng.random() < 0.4 else "-".join(vocab.sample(rng, 2))
            path = f"{area}/{proj}"
            if rng.random() < 0.7:
                path += "/" + rng.choice(("docs", "notes", "meetings", "specs", "research", "design", "ops"))
            if rng.random() < 0.3:
                path += "/" + "-".join(vocab.sample(rng, 1))
        else:
            path = f"{area}/" + "-".join(vocab.sample(rng, rng.randint(1, 2)))
            if rng.random() < 0.4:
                path += "/" + "-".join(vocab.sample(rng, 1))
        out.append("".join(c if c.isalnum() or c in "-/_" else "-" for c in path))
    return list(dict.fromkeys(out))


def _sizes(rng: random.Random, n: int, total: int) -> list[int]:
    raw = [rng.lognormvariate(0.0, 1.0) for _ in range(n)]
    k = total / sum(raw)
    return [max(200, min(int(r * k), 3_000_000)) for r in raw]


def _rfc3339(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def generate(out: str, scale: float = 1.0, seed: int = 7, log=print) -> dict:
    """Generate (or reuse) the corpus below ``out``; returns the stamp."""
    stamp_path = os.path.join(out, "stamp.json")
    want = {"generator": GENERATOR, "seed": seed, "scale": scale}
    try:
        with open(stamp_path) as f:
            have = json.load(f)
        if all(have.get(k) == v for k, v in want.items()):
            return have
    except (OSError, ValueError):
        pass
    t0 = time.monotonic()
    os.makedirs(out, exist_ok=True)
    for name in ("stamp.json", "queries.json"):
        try:
            os.unlink(os.path.join(out, name))
        except FileNotFoundError:
            pass
    for name in ("home", "agent"):
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    home = os.path.join(out, "home")
    chats = os.path.join(out, "agent", "chats")
    os.makedirs(chats)
    os.makedirs(os.path.join(out, "agent", "skills"))

    rng = random.Random(seed)
    vocab = Vocabulary(rng)
    w = Writer(vocab, rng)

    n_files = max(10, round(FILES * scale))
    folders = _folders(vocab, rng, max(5, n_files // 16))
    folder_cum = list(itertools.accumulate(1.0 / (r + 3) ** 0.8 for r in range(1, len(folders) + 1)))
    used: set[str] = set()
    home_bytes = 0
    for i, size in enumerate(_sizes(rng, n_files, int(HOME_BYTES * scale))):
        folder = rng.choices(folders, cum_weights=folder_cum)[0]
        if folder.startswith("journal/"):
            stem = f"{folder[8:].replace('/', '-')}-{rng.randint(1, 28):02d}"
        else:
            stem = "-".join(x for x in vocab.sample(rng, rng.randint(2, 4)) if x.isalpha()) or f"note{i}"
        rel = f"{folder}/{stem}" if folder else stem
        n = 2
        base = rel
        while rel in used:
            rel = f"{base}-{n}"
            n += 1
        used.add(rel)
        path = os.path.join(home, rel + ".md")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = w.document(size).encode()
        with open(path, "wb") as f:
            f.write(data)
        home_bytes += len(data)
        if log and (i + 1) % 2000 == 0:
            log(f"  corpus: {i + 1}/{n_files} files, {home_bytes / 1e6:.1f} MB")

    n_threads = max(2, round(THREADS * scale))
    chat_bytes = 0
    messages = 0
    base_t = datetime(2024, 1, 1, tzinfo=timezone.utc)
    for i in range(n_threads):
        t = base_t + timedelta(seconds=rng.randint(0, 600 * 86400))
        slug = "-".join(x for x in vocab.sample(rng, 2) if x.isalpha()) or "chat"
        thread = f"{t:%Y-%m-%d}-{slug}-{i:04d}"
        sender = OWNER if rng.random() < 0.7 else f"{OWNER}/{rng.choice(('telegram', 'email', 'web'))}"
        lines = []
        for m in range(rng.randint(5, 60)):
            role = "user" if m % 2 == 0 else "assistant"
            t += timedelta(seconds=rng.randint(5, 900))
            obj = {"role": role, "text": w.message(role), "at": _rfc3339(t),
                   "from": sender if role == "user" else AGENT_ID}
            lines.append(json.dumps(obj, ensure_ascii=False))
            messages += 1
        data = ("\n".join(lines) + "\n").encode()
        with open(os.path.join(chats, thread + ".jsonl"), "wb") as f:
            f.write(data)
        chat_bytes += len(data)

    queries = make_queries(vocab, w, rng)
    with open(os.path.join(out, "queries.json"), "w") as f:
        json.dump(queries, f, indent=0, ensure_ascii=False)
    stamp = dict(want, files=n_files, home_bytes=home_bytes, threads=n_threads, messages=messages,
                 chat_bytes=chat_bytes, queries=len(queries), seconds=round(time.monotonic() - t0, 1))
    with open(stamp_path + ".tmp", "w") as f:
        json.dump(stamp, f, indent=1)
    os.replace(stamp_path + ".tmp", stamp_path)
    return stamp


def make_queries(vocab: Vocabulary, w: Writer, rng: random.Random, n: int = QUERIES) -> list[str]:
    """1-4 word queries: common words, rare terms and names, corpus phrases."""
    common = [x for x in vocab.words[len(FUNCTION):3000] if x.isalpha()]
    mid = [x for x in vocab.words[3000:20000]]

    def clean(p: str) -> str:
        ws = ["".join(c for c in x if c.isalnum() or c in "-_") for x in p.split()]
        return " ".join(x for x in ws if x)

    fn = set(FUNCTION)
    phrases = [q for q in (clean(p) for p in w.phrases)
               if len(q.split()) >= 2 and sum(x.lower() not in fn for x in q.split()) >= 1]
    rng.shuffle(phrases)
    out: list[str] = []
    plan = ([("common", 45), ("rare", 30), ("common+rare", 35), ("words", 30), ("mid", 10)])
    for kind, k in plan:
        for _ in range(k):
            if kind == "common":
                q = rng.choice(common)
            elif kind == "rare":
                q = vocab.rare(rng)
            elif kind == "common+rare":
                q = f"{rng.choice(common)} {vocab.rare(rng)}"
            elif kind == "words":
                q = " ".join(rng.choice(common) for _ in range(rng.randint(2, 4)))
            else:
                q = rng.choice(mid)
            out.append(" ".join(q.split()[:4]))
    out += [" ".join(p.split()[:4]) for p in phrases[: n - len(out)]]
    while len(out) < n:
        out.append(" ".join(rng.choice(common) for _ in range(2)))
    rng.shuffle(out)
    return out[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=DEFAULT_OUT)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    if not 0 < a.scale <= 10:
        ap.error("--scale: between 0 and 10")
    stamp = generate(a.out, a.scale, a.seed, log=lambda s: print(s, file=sys.stderr))
    print(json.dumps(stamp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
