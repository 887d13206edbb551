"""The writing side: shards, the output directory and its atomic rename, provenance, signal handling."""
