"""What the chapters measure, on top of the library: exposure bias and DAgger (ch. 05), a forced token (ch. 04),
scoring and repetition (ch. 03), truncation against the truth, beam-search KV sharing (ch. 07), constrained
decoding's KL (07d), best-of-n (07e), and timing that waits for the GPU. Nothing below imports this package."""
