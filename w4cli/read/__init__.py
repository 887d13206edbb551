"""The reading side: a Hub id or directory becomes a checked checkpoint (its files, config and quantized layers)."""
