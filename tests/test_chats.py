"""Conversations read from JSON lines: the shapes a message may take, lines skipped,
a thread named by its file."""

from lnkmem.index.text import chats


def test_conversation_shapes():
    data = "\n".join([
        '{"role": "user", "text": "hello there", "at": "2026-01-01T00:00:00Z", "from": "o1"}',
        '{"role": "assistant", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}',
        '{"type": "user", "message": {"role": "user", "content": "harness line"}, "timestamp": "2026-01-02T00:00:00Z"}',
        'not json',
        '{"what": 1}',
        '{"role": "user", "text": "half wri',
    ])
    msgs, skipped = chats.messages(data)
    assert [(m.line, m.role, m.text) for m in msgs] == [
        (1, "user", "hello there"), (2, "assistant", "hi"), (3, "user", "harness line")]
    assert msgs[2].at == "2026-01-02T00:00:00Z" and skipped == 3
    assert chats.thread_of("o1.compact.jsonl") == "o1" and chats.thread_of("o1.md") == "o1"
