"""Text into words and passages: analysis, the query language, chunking of text, conversations and documents."""
