// llminfer's chat page: a model picker from /v1/models, a system prompt, and
// a chat streamed from /v1/chat/completions as server-sent events, with a
// Stop button. Model text is escaped before any formatting (renderMarkdown):
// nothing the model writes becomes markup of its own. Reasoning (the
// stream's reasoning_content, or a reply's <think>...</think>) is shown
// apart, dimmed and collapsible. No build step, no network but this server.
"use strict";

const $ = (id) => document.getElementById(id);
// what the page holds, open to tests and to the console
const state = { history: [], controller: null, busy: false, updates: 0, last: null };
window.chatState = state;

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
function escapeHTML(s) {
  return s.replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

// formatting within one line of escaped text: `code`, **bold**, *italic*,
// [links](https://...) with http(s) targets only
function inline(escaped) {
  return escaped.split(/(`[^`]+`)/).map((piece, i) => {
    if (i % 2 === 1) return "<code>" + piece.slice(1, -1) + "</code>";
    return piece
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
      .replace(/\[([^\]]+)\]\((https?:\/\/[^\s()]+)\)/g,
               '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
  }).join("");
}

// A small markdown subset as HTML: fenced code blocks, paragraphs, line
// breaks and inline() formatting. Every piece of text is escaped first.
function renderMarkdown(text) {
  const out = [];
  text.split("```").forEach((part, i) => {
    if (i % 2 === 1) {  // a fenced block; its first line may name a language
      const nl = part.indexOf("\n");
      out.push("<pre><code>" + escapeHTML(nl >= 0 ? part.slice(nl + 1) : part) + "</code></pre>");
      return;
    }
    for (const para of part.split(/\n{2,}/)) {
      if (para.trim()) out.push("<p>" + para.split("\n").map((l) => inline(escapeHTML(l))).join("<br>") + "</p>");
    }
  });
  return out.join("");
}
window.renderMarkdown = renderMarkdown;

function headers() {
  const h = { "content-type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text) {
  $("status").textContent = text;
}

async function errorText(response) {
  try {
    const body = await response.json();
    const err = body.error || {};
    return `${response.status}: ${err.message || JSON.stringify(body)}`;
  } catch (e) {
    return `${response.status} ${response.statusText}`;
  }
}

async function loadModels() {
  const select = $("model");
  const chosen = select.value || localStorage.getItem("llminfer.model");
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const models = (await r.json()).data || [];
    select.replaceChildren(...models.map((m) => {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = m.status && m.status.value ? `${m.id} (${m.status.value})` : m.id;
      return o;
    }));
    if (models.some((m) => m.id === chosen)) select.value = chosen;
  } catch (e) {
    setStatus("cannot list the models: " + e.message);
  }
}

function addMessage(role) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  div.append(label);
  $("messages").append(div);
  return div;
}

function addUser(text) {
  const div = addMessage("user");
  div.append(document.createTextNode(text));
}

// the assistant's bubble: a collapsible reasoning part and the answer
function addAssistant() {
  const div = addMessage("assistant");
  const details = document.createElement("details");
  details.className = "reasoning";
  details.open = true;
  details.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "thinking";
  const thought = document.createElement("div");
  thought.className = "text";
  details.append(summary, thought);
  const answer = document.createElement("div");
  answer.className = "answer";
  div.append(details, answer);
  return {
    div,
    update(reasoning, content) {
      // a reply that thinks in its text: <think>...</think> before the answer
      if (!reasoning && content.startsWith("<think>")) {
        const end = content.indexOf("</think>");
        reasoning = end < 0 ? content.slice(7) : content.slice(7, end);
        content = end < 0 ? "" : content.slice(end + 8).replace(/^\s+/, "");
      }
      if (reasoning) {
        details.hidden = false;
        thought.textContent = reasoning;
        if (content) details.open = false;
      }
      answer.innerHTML = renderMarkdown(content);
      state.updates += 1;
      $("messages").scrollTop = $("messages").scrollHeight;
    },
    error(message) {
      div.classList.add("error");
      const p = document.createElement("p");
      p.textContent = message;
      div.append(p);
    },
  };
}

// the JSON events of a server-sent-event body, until [DONE]
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
}

function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

async function send(text) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.history, { role: "user", content: text });
  const body = { model: $("model").value, messages, stream: true };
  const temperature = parseFloat($("temperature").value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  localStorage.setItem("llminfer.model", body.model);
  addUser(text);
  const view = addAssistant();
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  setStatus("generating...");
  let content = "", reasoning = "", outcome = "done", finish = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    for await (const event of sseEvents(r.body)) {
      if (event.error) throw new Error(event.error.message || "the server failed");
      const choice = (event.choices || [])[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      if (delta.reasoning_content) reasoning += delta.reasoning_content;
      if (delta.content) content += delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
      if (delta.reasoning_content || delta.content) view.update(reasoning, content);
    }
    setStatus(finish === "length" ? "done (the token limit cut it short)" : "done");
  } catch (e) {
    if (e.name === "AbortError") {
      outcome = "stopped";
      setStatus("stopped");
    } else {
      outcome = "error";
      view.error(e.message);
      setStatus("error");
    }
  } finally {
    state.history.push({ role: "user", content: text });
    if (content) state.history.push({ role: "assistant", content });
    state.controller = null;
    state.last = { content, reasoning, outcome, finish };
    setBusy(false);
    loadModels();  // a model's state may have changed (loaded, unloaded)
  }
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value;
  if (!text.trim() || state.busy) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("clear").addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  state.history = [];
  $("messages").replaceChildren();
  setStatus("");
});
$("settings-toggle").addEventListener("click", () => {
  const s = $("settings");
  s.hidden = !s.hidden;
  $("settings-toggle").setAttribute("aria-expanded", String(!s.hidden));
});
for (const id of ["system", "api-key", "temperature", "max-tokens"]) {
  const el = $(id);
  const saved = localStorage.getItem("llminfer." + id);
  if (saved !== null) el.value = saved;
  el.addEventListener("change", () => {
    localStorage.setItem("llminfer." + id, el.value);
    if (id === "api-key") loadModels();
  });
}
loadModels();
