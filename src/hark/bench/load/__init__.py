"""``hark bench load``: many callers at once, each talking in real time like a person.

Every simulated caller opens a Realtime session over WebSocket with server VAD, then streams
its microphone in real time (``--chunk-ms`` chunks, quiet noise between words): it thinks,
asks a spoken question, listens to the reply and pauses, over and over. Callers start
evenly over ``--ramp`` and all hang up ``--duration`` after the ramp; a caller whose call
reaches ``--call-duration`` (±50 %) hangs up and dials again, as phone callers do, so a
long run (``--duration 30m``) is also a soak test.

Measured on the client's clock:

- **VAD decision lag**: from sending the chunk that holds the audio at a
  ``speech_stopped``'s ``audio_end_ms`` to receiving that ``speech_stopped``: how long the
  server took to decide, once it had the audio it decided on (the VAD hears 32 ms chunks cut
  straight from the input, so nothing is held back before it).
- **Speech end lag**: from sending the chunk that holds a question's last voiced sample to
  receiving its ``speech_stopped``, less ``--silence-ms``: what the caller waits past the
  silence it asked for (the VAD's own delay in hearing the end, the chunking, and the
  server's time).
- **E2A**: ``speech_stopped`` received → first reply audio received. **V2V**: the chunk
  with the question's last voiced sample sent → first reply audio received.
- **Failures**: calls that could not connect, were closed by the server, got an ``error``
  event or a failed response; **missed turns**: questions without a ``speech_stopped``.
- **Send lag**: how late the generator itself sent chunks; when it is large the generator,
  not the server, was the bottleneck.

``--transcribe`` turns input transcription on, so that every turn is also recognised as it is
spoken; ``--server-pid`` (a server on this machine) adds the server's CPU time per
session-second after the ramp.

The server's own figures come from its ``/metrics`` every ``--sample`` seconds: sessions,
event-loop lag, VAD batches, late and dropped audio, errors, and each process's memory and
open file descriptors, which should stay flat. The report is JSON (``--json``), a summary
and a chart over time (``--chart``, needs matplotlib). The command only talks to ``--url``.
"""

from hark.bench.load.cli import command, configure_parser
from hark.bench.load.config import LoadConfig
from hark.bench.load.generator import run_load_bench

__all__ = ["LoadConfig", "command", "configure_parser", "run_load_bench"]
