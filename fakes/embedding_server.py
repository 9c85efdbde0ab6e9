"""A fake embedding endpoint (PROTOCOL.md §6).

    python -m fakes.embedding_server (--unix PATH | --port N) [--dim 64] [--widths N,N,...]
        [--model NAME] [--bindings FILE] [--log FILE] [fault flags]

``POST /v1/embeddings`` ``{"model", "input": [str, ...]}`` answers
``{"data": [{"index", "embedding"}], "model"}``. The vectors are deterministic
with a crude "meaning": words are lower-cased, stripped of a suffix (s, es,
ing, ed), mapped through ``SYNONYMS`` to concepts, hashed (sha256) with a sign
into ``dim`` buckets and L2-normalised; so "automobile purchase" lies close to
"buying a car", and two synonyms alone embed identically.

Refused: a wrong model (404), more than 64 inputs, an empty or non-string
input, a body that is not JSON (400). With ``--bindings FILE`` (JSON
``{"<agent>": {"owner", "key"}}``, re-read on every request) every request
needs ``Authorization: Link-Binding <agent>:<proof>`` for purpose
``embedding`` (401 otherwise).

Faults: those of ``fakes.http`` (``POST /_fault``), among them ``die`` and
``refuse`` (then SIGUSR1, or the fault's ``delay``, listens again).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from pathlib import Path

from fakes import auth
from fakes.http import HttpError, Request, Response, add_server_args, json_response, serve

MAX_INPUTS = 64
HASHES_PER_FEATURE = 3

# concept -> the words that mean it (each word in exactly one group)
SYNONYMS: dict[str, tuple[str, ...]] = {
    "car": ("car", "automobile", "vehicle", "auto", "motorcar"),
    "doctor": ("doctor", "physician", "medic", "clinician"),
    "happy": ("happy", "glad", "joyful", "cheerful", "delighted"),
    "sad": ("sad", "unhappy", "sorrowful", "gloomy", "miserable"),
    "buy": ("buy", "purchase", "acquire", "bought"),
    "sell": ("sell", "sold", "vend", "retail"),
    "big": ("big", "large", "huge", "enormous", "giant"),
    "small": ("small", "little", "tiny", "miniature"),
    "house": ("house", "home", "dwelling", "residence"),
    "fast": ("fast", "quick", "rapid", "swift", "speedy"),
    "slow": ("slow", "sluggish", "unhurried", "leisurely"),
    "begin": ("begin", "start", "commence", "launch"),
    "end": ("end", "finish", "conclude", "terminate"),
    "error": ("error", "bug", "fault", "defect", "mistake", "glitch"),
    "money": ("money", "cash", "funds", "fund", "payment", "currency"),
    "price": ("price", "cost", "fee", "charge"),
    "smart": ("smart", "clever", "intelligent", "brilliant"),
    "child": ("child", "kid", "youngster", "children"),
    "job": ("job", "occupation", "employment", "career", "profession"),
    "talk": ("talk", "speak", "converse", "discuss", "chat"),
    "food": ("food", "meal", "dish", "cuisine"),
    "eat": ("eat", "dine", "consume", "devour"),
    "dog": ("dog", "puppy", "hound", "canine"),
    "cat": ("cat", "kitten", "feline", "kitty"),
    "picture": ("picture", "photo", "image", "photograph"),
    "film": ("film", "movie", "cinema"),
    "book": ("book", "novel", "paperback"),
    "road": ("road", "street", "highway", "avenue"),
    "city": ("city", "town", "metropolis"),
    "shop": ("shop", "store", "market", "boutique"),
    "plane": ("plane", "airplane", "aircraft", "jet"),
    "boat": ("boat", "ship", "vessel"),
    "trip": ("trip", "journey", "travel", "voyage", "vacation", "holiday"),
    "hotel": ("hotel", "motel", "inn", "lodging"),
    "medicine": ("medicine", "drug", "medication", "pill"),
    "sick": ("sick", "ill", "unwell", "ailing"),
    "fix": ("fix", "repair", "mend", "patch"),
    "help": ("help", "assist", "aid", "support"),
    "idea": ("idea", "concept", "notion", "thought"),
    "plan": ("plan", "schedule", "roadmap", "agenda"),
    "answer": ("answer", "reply", "response", "respond"),
    "ask": ("ask", "question", "inquire", "query"),
    "angry": ("angry", "mad", "furious", "annoyed"),
    "afraid": ("afraid", "scared", "frightened", "fearful"),
    "friend": ("friend", "buddy", "pal", "companion"),
    "spouse": ("spouse", "wife", "husband", "partner"),
    "mother": ("mother", "mom", "mum", "mama"),
    "father": ("father", "dad", "papa"),
    "cold": ("cold", "chilly", "freezing", "frosty"),
    "computer": ("computer", "laptop", "pc", "workstation"),
    "phone": ("phone", "telephone", "mobile", "smartphone", "cellphone"),
    "email": ("email", "mail", "message", "letter"),
    "password": ("password", "passphrase", "passcode", "credential"),
    "delete": ("delete", "remove", "erase"),
    "company": ("company", "firm", "business", "corporation", "enterprise"),
    "boss": ("boss", "manager", "supervisor"),
    "sea": ("sea", "ocean"),
    "mountain": ("mountain", "peak", "summit"),
}

CONCEPT_OF: dict[str, str] = {w: c for c, words in SYNONYMS.items() for w in words}

STOPWORDS = frozenset(
    "a an the of to in on for and or is are was were be been with at by it its this that "
    "my your our their his her i we you they me us them as from into about".split()
)

SUFFIXES = ("ing", "es", "ed", "s")
WORD_RE = re.compile(r"\w+")


def stem(word: str) -> str:
    """A crude English stem: boxes -> box, notes -> note, stopped -> stop."""
    if len(word) > 4 and word.endswith("ing"):
        s = word[:-3]
    elif len(word) > 3 and word.endswith("ed"):
        s = word[:-2]
    elif word.endswith("es") and word[:-2].endswith(("s", "x", "z", "ch", "sh")):
        return word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    else:
        return word
    return s[:-1] if len(s) >= 3 and s[-1] == s[-2] and s[-1] not in "lsz" else s


def _candidates(word: str) -> list[str]:
    """Spellings to look a word up by in the synonym table, most likely first."""
    out = [word, stem(word)]
    for suffix in SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 2:
            out += [word[: -len(suffix)], word[: -len(suffix)] + "e"]
    return out


def features(text: str) -> list[str]:
    """The features a text is embedded from: ``c:<concept>`` or ``w:<stem>``."""
    out = []
    for word in WORD_RE.findall(text.lower()):
        if word in STOPWORDS:
            continue
        concept = next((CONCEPT_OF[c] for c in _candidates(word) if c in CONCEPT_OF), None)
        out.append(f"c:{concept}" if concept else f"w:{stem(word)}")
    return out


def embed(text: str, dim: int = 64) -> list[float]:
    vec = [0.0] * dim
    for feature in features(text) or ["empty:"]:
        digest = hashlib.sha256(feature.encode()).digest()
        for k in range(HASHES_PER_FEATURE):
            bucket = int.from_bytes(digest[4 * k: 4 * k + 4], "big") % dim
            vec[bucket] += 1.0 if digest[20 + k] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vec))
    if norm == 0.0:  # the signs cancelled out: any fixed unit vector
        vec[0], norm = 1.0, 1.0
    return [x / norm for x in vec]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))



def check_route(req: Request) -> None:
    """Only ``POST /v1/embeddings`` is served."""
    if req.path != "/v1/embeddings":
        raise HttpError(404, "not found")
    if req.method != "POST":
        raise HttpError(405, "POST only", {"Allow": "POST"})


def embedding_inputs(req: Request, model: str) -> list[str]:
    """The texts of a valid §6 request for ``model``; HttpError naming what is wrong."""
    body = req.json()
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    if body.get("model") != model:
        raise HttpError(404, f"model {str(body.get('model'))[:200]!r} not found")
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs):
        raise HttpError(400, "input must be a non-empty list of strings")
    if len(inputs) > MAX_INPUTS:
        raise HttpError(400, f"at most {MAX_INPUTS} inputs a request")
    return inputs


class EmbeddingEndpoint:
    def __init__(self, model: str, dim: int, bindings: str | None, widths: list[int] | None = None):
        self.model = model
        self.dim = dim
        self.bindings = Path(bindings) if bindings else None
        self.widths = list(widths or [])  # a model misbehaving: the first requests answered this wide

    def __call__(self, req: Request) -> Response:
        check_route(req)
        if self.bindings is not None:
            self._authenticate(req)
        inputs = embedding_inputs(req, self.model)
        dim = self.widths.pop(0) if self.widths else self.dim
        data = [{"object": "embedding", "index": i, "embedding": embed(s, dim)}
                for i, s in enumerate(inputs)]
        return json_response({"object": "list", "data": data, "model": self.model})

    def _authenticate(self, req: Request) -> None:
        value = req.header("authorization")
        try:
            req.agent = auth.parse(value)[0]
            auth.verify(value, _read_json(self.bindings), "embedding")
        except auth.Refused as e:
            raise HttpError(401, str(e)) from None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:
        raise HttpError(500, f"{path} is not JSON") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.embedding_server", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--dim", type=int, default=64, help="vector size (default 64)")
    parser.add_argument("--model", default="fake-mini", help='the one model served (default "fake-mini")')
    parser.add_argument("--bindings", metavar="FILE", help="require Link-Binding proofs for these bindings")
    parser.add_argument("--widths", metavar="N,N,...", default="",
                        help="a misbehaving model: the first requests answered this wide, one each, then --dim")
    args = parser.parse_args(argv)
    if args.dim < 1:
        parser.error("--dim must be at least 1")
    try:
        widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        parser.error("--widths: whole numbers separated by commas")
    if any(w < 1 for w in widths):
        parser.error("--widths must each be at least 1")
    endpoint = EmbeddingEndpoint(args.model, args.dim, args.bindings, widths)
    return serve(endpoint, args, {"model": args.model, "dim": args.dim})


if __name__ == "__main__":
    sys.exit(main())
