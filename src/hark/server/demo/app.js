// hark's browser demo. The call is made the way OpenAI's WebRTC guide shows: a peer
// connection with the microphone track and an "oai-events" data channel, and the SDP offer
// posted to /v1/realtime/calls with an ephemeral key. The key comes from this page's server
// (POST /demo/client_secret) and expires within a minute; the page never sees an API key.
"use strict";

const MODEL = "gpt-realtime";
// Server timing stages, in the order they happen, and how the page names them.
const STAGES = [
  ["transcript", "transcript"],
  ["llm_first_token", "first token"],
  ["first_clause", "first clause"],
  ["tts_first_audio", "first audio made"],
  ["first_audio_sent", "first audio sent"],
];

const ui = {
  talk: document.getElementById("talk"),
  status: document.getElementById("status"),
  userLive: document.getElementById("user-live"),
  assistantLive: document.getElementById("assistant-live"),
  turns: document.getElementById("turns"),
  remote: document.getElementById("remote"),
  micLevel: document.getElementById("mic-level"),
  replyLevel: document.getElementById("reply-level"),
};

// The call in progress, or null.
let call = null;
// Turns by the user item's id, and by the id of the response that answered them.
const turnsByItem = new Map();
const turnsByResponse = new Map();
let turnCount = 0;

ui.talk.addEventListener("click", () => {
  if (call) {
    hangUp("Call ended. Press Talk to start again.");
  } else {
    start().catch((error) => hangUp(`Could not start the call: ${error.message}`));
  }
});
window.addEventListener("pagehide", () => hangUp(""));
if (!navigator.mediaDevices) {
  // Browsers only offer the microphone to https pages and to localhost.
  ui.talk.disabled = true;
  setStatus("This browser offers no microphone to this page: open it over https or on localhost.");
}

async function start() {
  ui.talk.disabled = true;
  // Made inside the click, so that the browser lets it run.
  const audio = new AudioContext();
  call = { pc: null, stream: null, audio, key: null, expiresAt: 0, callId: null, meters: [] };
  const current = call;

  setStatus("Getting a short-lived key…");
  const secret = await postJson("/demo/client_secret");
  current.key = secret.value;
  current.expiresAt = secret.expires_at;

  setStatus("Opening the microphone…");
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  current.stream = stream;
  if (call !== current) {
    stream.getTracks().forEach((track) => track.stop());
    return;
  }
  current.meters.push(levelMeter(audio, stream, ui.micLevel));

  const pc = new RTCPeerConnection();
  current.pc = pc;
  pc.ontrack = (event) => {
    const remote = event.streams[0] || new MediaStream([event.track]);
    ui.remote.srcObject = remote;
    current.meters.push(levelMeter(audio, remote, ui.replyLevel));
  };
  pc.addTrack(stream.getTracks()[0]);
  pc.addEventListener("connectionstatechange", () => {
    if (call === current && ["failed", "closed"].includes(pc.connectionState)) {
      hangUp("The connection was lost. Press Talk to call again.");
    }
  });

  const dc = pc.createDataChannel("oai-events");
  dc.addEventListener("open", () => setStatus("Connected. Say something."));
  dc.addEventListener("message", (event) => onServerEvent(JSON.parse(event.data)));

  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  setStatus("Calling hark…");
  const response = await fetch(`${location.origin}/v1/realtime/calls?model=${MODEL}`, {
    method: "POST",
    body: offer.sdp,
    headers: {
      Authorization: `Bearer ${current.key}`,
      "Content-Type": "application/sdp",
    },
  });
  if (!response.ok) {
    throw new Error(await errorMessage(response));
  }
  // "/v1/realtime/calls/rtc_…": the id to hang up with.
  current.callId = (response.headers.get("Location") || "").split("/").pop() || null;
  const answer = { type: "answer", sdp: await response.text() };
  if (call !== current) {
    return;
  }
  await pc.setRemoteDescription(answer);

  ui.talk.textContent = "Stop";
  ui.talk.setAttribute("aria-pressed", "true");
  ui.talk.disabled = false;
  document.body.dataset.call = "on";
}

function hangUp(message) {
  const ended = call;
  call = null;
  if (ended) {
    // Closing the peer connection ends the call too; the hang-up just says so at once.
    if (ended.callId && ended.key && Date.now() / 1000 < ended.expiresAt) {
      fetch(`/v1/realtime/calls/${encodeURIComponent(ended.callId)}/hangup`, {
        method: "POST",
        headers: { Authorization: `Bearer ${ended.key}` },
        keepalive: true,
      }).catch(() => {});
    }
    ended.meters.forEach((stop) => stop());
    if (ended.pc) {
      ended.pc.close();
    }
    if (ended.stream) {
      ended.stream.getTracks().forEach((track) => track.stop());
    }
    ended.audio.close().catch(() => {});
  }
  ui.remote.srcObject = null;
  ui.micLevel.value = 0;
  ui.replyLevel.value = 0;
  ui.talk.textContent = "Talk";
  ui.talk.setAttribute("aria-pressed", "false");
  ui.talk.disabled = false;
  delete document.body.dataset.call;
  if (message) {
    setStatus(message);
  }
}

// ------------------------------------------------------------------ server events

function onServerEvent(event) {
  switch (event.type) {
    case "input_audio_buffer.speech_started":
      setStatus("Listening…");
      setLive(ui.userLive, "");
      break;
    case "input_audio_buffer.speech_stopped": {
      const turn = turnFor(event.item_id);
      turn.stoppedAt = performance.now();
      setStatus("Thinking…");
      break;
    }
    case "input_audio_buffer.committed":
      turnFor(event.item_id);
      break;
    case "conversation.item.input_audio_transcription.delta": {
      const turn = turnFor(event.item_id);
      turn.user += event.delta;
      showUser(turn);
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const turn = turnFor(event.item_id);
      turn.user = event.transcript;
      showUser(turn);
      break;
    }
    case "response.created": {
      // A response answers the latest turn that has none yet (or stands on its own).
      let turn = [...turnsByItem.values()].reverse().find((t) => !t.responseId);
      if (!turn) {
        turn = newTurn(`response:${event.response.id}`);
      }
      turn.responseId = event.response.id;
      turnsByResponse.set(turn.responseId, turn);
      setLive(ui.assistantLive, "");
      break;
    }
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta": {
      const turn = turnsByResponse.get(event.response_id);
      if (turn) {
        turn.assistant += event.delta;
        showAssistant(turn);
      }
      break;
    }
    case "response.output_audio_transcript.done":
    case "response.output_text.done": {
      const turn = turnsByResponse.get(event.response_id);
      if (turn) {
        turn.assistant = event.transcript ?? event.text;
        showAssistant(turn);
      }
      break;
    }
    case "output_audio_buffer.started": {
      const turn = turnsByResponse.get(event.response_id);
      if (turn && turn.stoppedAt !== null && turn.pageMs === null) {
        turn.pageMs = performance.now() - turn.stoppedAt;
        showLatency(turn);
      }
      setStatus("Speaking… (talk over it to interrupt)");
      break;
    }
    case "output_audio_buffer.stopped":
      setStatus("Your turn.");
      break;
    case "output_audio_buffer.cleared":
      setStatus("Interrupted. Listening…");
      break;
    case "response.done": {
      const turn = turnsByResponse.get(event.response.id);
      if (turn) {
        turn.outcome = event.response.status;
        showLatency(turn);
      }
      break;
    }
    case "hark.turn_timings": {
      const turn = turnsByResponse.get(event.response_id);
      if (turn) {
        turn.timings = event;
        showLatency(turn);
      }
      break;
    }
    case "error":
      setStatus(`Server error: ${event.error.message}`);
      break;
    default:
      break;
  }
}

// ------------------------------------------------------------------ turns

function turnFor(itemId) {
  return turnsByItem.get(itemId) || newTurn(itemId);
}

function newTurn(key) {
  turnCount += 1;
  const row = document.createElement("tr");
  row.className = "turn";
  const cells = {};
  for (const name of ["n", "user", "assistant", "latency"]) {
    cells[name] = document.createElement("td");
    cells[name].className = name;
    row.append(cells[name]);
  }
  cells.n.textContent = String(turnCount);
  cells.user.textContent = "…";
  cells.assistant.textContent = "…";
  cells.latency.textContent = "…";
  ui.turns.querySelector("tr.empty")?.remove();
  ui.turns.prepend(row);
  const turn = {
    user: "",
    assistant: "",
    responseId: null,
    stoppedAt: null,
    pageMs: null,
    timings: null,
    outcome: null,
    cells,
  };
  turnsByItem.set(key, turn);
  return turn;
}

function showUser(turn) {
  turn.cells.user.textContent = turn.user || "…";
  setLive(ui.userLive, turn.user);
}

function showAssistant(turn) {
  turn.cells.assistant.textContent = turn.assistant || "…";
  setLive(ui.assistantLive, turn.assistant);
}

function showLatency(turn) {
  const cell = turn.cells.latency;
  const timings = turn.timings;
  const serverMs = timings ? timings.e2a_ms : null;
  cell.replaceChildren();
  // The headline: end of turn to first reply audio, by the server if it said, else the page.
  const headline = serverMs ?? turn.pageMs;
  if (headline !== null) {
    const big = document.createElement("div");
    const value = document.createElement("strong");
    value.className = "headline";
    value.textContent = ms(headline);
    big.append(value, ` end of turn → first audio${serverMs !== null ? " (server)" : ""}`);
    cell.append(big);
  }
  const details = [];
  if (serverMs !== null && turn.pageMs !== null) {
    details.push(`${ms(turn.pageMs)} seen by this page`);
  }
  if (timings && timings.v2v_ms !== null) {
    details.push(`${ms(timings.v2v_ms)} voice-to-voice`);
  }
  if (turn.outcome && turn.outcome !== "completed") {
    details.push(turn.outcome === "cancelled" ? "interrupted" : turn.outcome);
  }
  if (details.length) {
    cell.append(line(details.join(" · ")));
  }
  if (timings && timings.stages_ms) {
    const stages = STAGES.filter(([key]) => key in timings.stages_ms)
      .map(([key, name]) => `${name} ${ms(timings.stages_ms[key])}`);
    if (stages.length) {
      cell.append(line(stages.join(" · "), "stages"));
    }
  }
  if (!cell.childElementCount) {
    cell.textContent = "…";
  }
  if (timings) {
    cell.dataset.serverMs = String(serverMs);
  }
  if (turn.pageMs !== null) {
    cell.dataset.pageMs = String(Math.round(turn.pageMs));
  }
}

function line(text, className) {
  const element = document.createElement("div");
  element.textContent = text;
  if (className) {
    element.className = className;
  }
  return element;
}

// ------------------------------------------------------------------ helpers

function setStatus(text) {
  ui.status.textContent = text;
}

function setLive(element, text) {
  element.textContent = text || "…";
  element.dataset.empty = text ? "false" : "true";
}

function ms(value) {
  return `${Math.round(value)} ms`;
}

async function postJson(url) {
  const response = await fetch(url, { method: "POST" });
  if (!response.ok) {
    throw new Error(await errorMessage(response));
  }
  return response.json();
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error.message;
  } catch {
    return `HTTP ${response.status}`;
  }
}

// Shows a stream's loudness on a <meter>; returns a function that stops it.
function levelMeter(audio, stream, meter) {
  const source = audio.createMediaStreamSource(stream);
  const analyser = audio.createAnalyser();
  analyser.fftSize = 1024;
  source.connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  const timer = setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const sample of samples) {
      sum += sample * sample;
    }
    // RMS on a loudness-like scale: speech sits in the upper half.
    meter.value = Math.min(1, Math.sqrt(Math.sqrt(sum / samples.length)) * 1.5);
  }, 100);
  return () => {
    clearInterval(timer);
    source.disconnect();
  };
}
