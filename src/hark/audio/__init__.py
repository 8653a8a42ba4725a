"""Audio plumbing: G.711 companding, sample-rate conversion and the Realtime wire formats."""
