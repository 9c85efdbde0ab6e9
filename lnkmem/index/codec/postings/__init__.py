"""One term's postings in one segment, as the bytes stored under its key: the names callers
use, handed on from the modules that hold them (a face: it defines nothing).

- :mod:`.layout`: the format (the layout below its docstring) and its lengths;
- :mod:`.encode`: :func:`pack` one list, :func:`pack_many` a commit's at once;
- :mod:`.runs`: reading bit-packed runs, every block of a list at once;
- :mod:`.decode`: :func:`unpack` one list, :func:`blocks` some of its blocks, :func:`lookup`
  those that may hold some pids;
- :mod:`.headers`: what a list's count and headers tell without its runs (:func:`count`,
  :func:`max_tf`, :func:`head`, the block-max bound :func:`block_tf`);
- :mod:`.checks`: lists from outside (a copy) checked to be what :func:`pack` makes
  (:func:`check`, :func:`check_many`, :func:`stated_counts`);
- :mod:`.join`: a merge's lists of one term in several segments joined (:func:`join_many`);
- :mod:`.cache`: :class:`Decoded`, decoded lists kept for searches.
"""

from lnkmem.index.codec.postings.cache import Decoded
from lnkmem.index.codec.postings.checks import check, check_many, stated_counts
from lnkmem.index.codec.postings.decode import blocks, lookup, unpack
from lnkmem.index.codec.postings.encode import pack, pack_many
from lnkmem.index.codec.postings.headers import block_tf, count, head, max_tf, stated_count
from lnkmem.index.codec.postings.join import join_many, joined
from lnkmem.index.codec.postings.layout import BLOCK, SMALL

__all__ = ["BLOCK", "SMALL", "Decoded", "block_tf", "blocks", "check", "check_many", "count", "head",
           "join_many", "joined", "lookup", "max_tf", "pack", "pack_many", "stated_count", "stated_counts",
           "unpack"]
