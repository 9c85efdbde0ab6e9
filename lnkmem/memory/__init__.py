"""One agent's (or team's) memory: its folders and config, the indexing loop, notes, changes, embeddings and the watcher."""
