"""Audio plumbing: codecs (G.711, Opus), sample-rate conversion and the Realtime wire formats."""
