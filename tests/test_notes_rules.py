"""The notes' rules: adding, removing (exactly one match) and folding entries, the size
limit named in bytes, and which threads may change the notes."""

import pytest

from lnkmem.core.errors import ToolError
from lnkmem.memory.notesrules import apply
from lnkmem.memory.threads import notes_refusal


def test_notes_add_remove_fold():
    c = apply("- a\n- b\n", "new\nline  here", None, 4000)
    assert c.text == "- a\n- b\n- new line here\n" and c.entries == 3
    c = apply(c.text, None, "  - b ", 4000)
    assert c.text == "- a\n- new line here\n"
    c = apply("- a\n- b\n", "c", "a", 4000)
    assert c.text == "- b\n- c\n"


def test_notes_remove_needs_exactly_one_match():
    with pytest.raises(ToolError) as e:
        apply("- tea\n- tea\n", None, "tea", 4000)
    assert "2 lines" in str(e.value) and "- tea" in str(e.value)
    with pytest.raises(ToolError) as e:
        apply("- green tea\n- coffee\n", None, "tea", 4000)
    assert "no line equals" in str(e.value) and "green tea" in str(e.value)
    with pytest.raises(ToolError):
        apply("- a\n", None, None, 4000)


def test_notes_limit_says_size_limit_and_how_much():
    with pytest.raises(ToolError) as e:
        apply("- " + "x" * 90 + "\n", "y" * 20, None, 100)
    msg = str(e.value)
    assert "116 bytes" in msg and "100 bytes" in msg and "16 bytes" in msg


def test_thread_rules():
    assert notes_refusal(None, "", False) is None  # without LNK_MEMORY_FROM every call is the owner's
    assert notes_refusal("o1", "o1", True) is None
    assert notes_refusal("o1/chat-2", "o1", True) is None
    for t in ("agent-x", "team-y", "task-z", "stranger", "o10"):
        assert notes_refusal(t, "o1", True)
    assert notes_refusal("o1", "", True)  # no owner: nothing proves it
