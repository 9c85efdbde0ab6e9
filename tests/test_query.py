"""The query language (§4.1 rev. 2), the date filters, ignore files (§3.2),
honest ranking status and tie-safe top-k, through the real `lnk-lnkmem serve`."""

from __future__ import annotations

import pytest

from tests.helpers import Server

# A small Home whose words overlap in many ways; the pinned rankings below were
# recorded on the code before the query language existed (commit 576885e):
# a query with no syntax must keep ranking exactly so.
PLAIN_CORPUS = {
    "notes/garden.md": "# Garden\nTomatoes need sun and water. The garden plan for spring: tomatoes, beans, basil.\n",
    "notes/kitchen.md": "# Kitchen\nBasil pesto with garden tomatoes. Water the basil daily in summer.\n",
    "projects/launch.md": "# Launch plan\nThe launch plan has three phases. Phase one: tests. Phase two: docs.\n",
    "projects/budget.md": "# Budget\nThe budget for the launch covers servers, docs and travel to the garden show.\n",
    "journal/2024-03-01.md": "Planted beans today. The spring sun was warm; watering plan changed.\n",
    "journal/2024-03-02.md": "Read about servers and water cooling. Pesto for dinner, basil from the garden.\n",
    "archive/old.md": "Old notes on travel, phases of the moon and planting by the moon's phases.\n",
}

PINNED = {
    'garden tomatoes': [
        ('home/notes/garden.md', 2.4833),
        ('home/notes/kitchen.md', 1.825),
        ('home/projects/budget.md', 0.604),
        ('home/journal/2024-03-02.md', 0.5516),
    ],
    'launch plan': [
        ('home/projects/launch.md', 2.8425),
        ('home/projects/budget.md', 1.221),
        ('home/journal/2024-03-01.md', 0.8161),
        ('home/notes/garden.md', 0.8161),
    ],
    'basil water': [
        ('home/notes/kitchen.md', 1.7789),
        ('home/notes/garden.md', 1.3842),
        ('home/journal/2024-03-02.md', 1.3442),
        ('home/journal/2024-03-01.md', 0.568),
    ],
    'servers docs travel': [
        ('home/projects/budget.md', 3.663),
        ('home/archive/old.md', 1.221),
        ('home/journal/2024-03-02.md', 1.1151),
        ('home/projects/launch.md', 1.0838),
    ],
    'phases moon': [
        ('home/archive/old.md', 4.0324),
        ('home/projects/launch.md', 1.7603),
    ],
}


def _ranking(server, query):
    hits = server.search(query, limit=10)["structuredContent"]["hits"]
    return [(h["ref"], h["score"]) for h in hits]


@pytest.fixture
def plain_server(home):
    for rel, text in PLAIN_CORPUS.items():
        home.write(rel, text)
    s = Server.start(home)
    s.initialize()
    s.wait_indexed()
    yield s
    s.close()


def test_a_query_without_syntax_ranks_exactly_as_before(plain_server):
    got = {q: _ranking(plain_server, q) for q in PINNED}
    assert got == PINNED
