// flowmem transcript page: plain JavaScript over the /v1 API, with the caller's own token.
// The token lives in sessionStorage and goes out as a bearer header; no cookie is set.
// Every piece of stored text is put on the page with textContent, never as HTML.
"use strict";

const SLOT = 1048576;          // flowmem.plan.SLOT: appended entries sit at multiples of it
const TOKEN_KEY = "flowmem.token";
const PAGE = 30;
const RETRY_MS = 2000;

const state = {
  token: null, me: null, session: null, canDrive: false,
  messages: new Map(),   // position -> message
  before: null, total: 0, fresh: new Set(), stream: null, streamFor: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "testid") node.dataset.testid = value;
    else if (key === "on") for (const [name, fn] of Object.entries(value)) node.addEventListener(name, fn);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

// ---- the API --------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const init = { method, headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const response = await fetch(path, init);
  let envelope = null;
  try { envelope = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok || !envelope || envelope.success !== true) {
    const code = envelope && envelope.error_code || "http_" + response.status;
    const text = envelope && envelope.error || response.statusText;
    if (response.status === 401) signOut("Your token was refused: " + text);
    throw new ApiError(response.status, code, text);
  }
  return envelope;
}

function showError(text) {
  const box = $("error");
  box.textContent = text || "";
  box.hidden = !text;
}

// ---- signing in -----------------------------------------------------------------------
async function signIn(token) {
  state.token = token;
  try {
    const who = await api("GET", "/v1/whoami");
    state.me = who.data;
    sessionStorage.setItem(TOKEN_KEY, token);
  } catch (error) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    showSignIn(error.status === 401 ? "That token was refused (unknown, revoked or expired)."
                                    : "Could not sign in: " + error.message);
    return;
  }
  showError("");
  $("signin").hidden = true;
  $("app").hidden = false;
  $("whoami").hidden = false;
  $("whoami").textContent = state.me.user_id + (state.me.admin ? " (admin)" : "");
  $("signout").hidden = false;
  await loadSessions();
  document.body.dataset.signedIn = state.me.user_id;
  const wanted = new URLSearchParams(location.hash.slice(1)).get("session");
  if (wanted) await openSession(wanted);
}

function showSignIn(message) {
  $("app").hidden = true;
  $("whoami").hidden = true;
  $("signout").hidden = true;
  $("signin").hidden = false;
  showError(message || "");
}

function signOut(message) {
  stopStream();
  delete document.body.dataset.signedIn;
  sessionStorage.removeItem(TOKEN_KEY);
  Object.assign(state, { token: null, me: null, session: null });
  showSignIn(message);
}

// ---- the session list -----------------------------------------------------------------
async function loadSessions() {
  for (const [role, list] of [["owner", $("owned")], ["viewer", $("shared")]]) {
    const page = await api("GET", "/v1/sessions?role=" + role + "&limit=100");
    list.replaceChildren(...page.data.map((s) => el("li", {},
      el("button", { type: "button", "data-session": s.id, testid: "session",
                     class: state.session && state.session.id === s.id ? "current" : null,
                     on: { click: () => openSession(s.id) } },
         s.title || s.id, el("small", { text: s.status + " · " + s.id.slice(0, 8) })))));
    if (!page.data.length) list.append(el("li", { class: "none", text: "none" }));
  }
}

// ---- one session ----------------------------------------------------------------------
async function openSession(id) {
  stopStream();
  showError("");
  let record;
  try {
    record = (await api("GET", "/v1/sessions/" + encodeURIComponent(id))).data;
  } catch (error) {
    state.session = null;
    $("transcript").hidden = true;
    $("empty").hidden = false;
    showError(error.code === "session_not_found" ? "No such session, or one you may not see."
                                                 : error.message);
    return;
  }
  history.replaceState(null, "", "#session=" + record.id);
  state.session = record;
  delete $("transcript").dataset.loaded;
  state.canDrive = state.me.admin || (record.owner !== null && record.owner === state.me.user_id);
  state.messages = new Map();
  state.fresh = new Set();
  $("deltas").replaceChildren();
  $("transcript").hidden = false;
  $("empty").hidden = true;
  renderHead();
  renderControls();
  await loadPage(null);
  $("transcript").dataset.loaded = record.id;
  for (const b of document.querySelectorAll("[data-session]"))
    b.classList.toggle("current", b.dataset.session === record.id);
  startStream(record.id);
}

function renderHead() {
  const s = state.session;
  $("session-title").textContent = s.title || "(untitled)";
  $("session-status").textContent = s.status;
  const role = state.me.admin ? "admin" : s.owner === state.me.user_id ? "owner" : "viewer";
  $("session-role").textContent = role === "viewer" ? "viewing (read only)" : role;
  $("session-meta").textContent = "owner " + (s.owner || "nobody") + " · id " + s.id;
}

function renderControls() {
  // MEM-9: a viewer never drives, so a viewer's page has no driving controls at all.
  const slot = $("controls-slot");
  if (!state.canDrive) { slot.replaceChildren(); return; }
  const text = el("textarea", { id: "composer", placeholder: "A user message to append…",
                                "aria-label": "user message" });
  slot.replaceChildren(el("section", { class: "controls", testid: "controls" }, text,
    el("div", { class: "row" },
      el("button", { type: "button", id: "send", on: { click: () => sendTurn(text) } }, "Append user turn"),
      el("button", { type: "button", id: "stop", on: { click: () => drive("stop") } }, "Stop"),
      el("button", { type: "button", id: "reset", class: "danger",
                     on: { click: () => confirm("Delete this session's conversation and memory?") && drive("reset") } },
         "Reset"))));
}

async function loadPage(before) {
  const query = "?limit=" + PAGE + (before === null ? "" : "&before=" + before);
  let page;
  try {
    page = await api("GET", "/v1/sessions/" + state.session.id + "/messages" + query);
  } catch (error) { showError(error.message); return; }
  for (const item of page.data.messages) state.messages.set(item.position, item.message);
  state.before = page.data.before;
  if (before === null) state.total = page.pagination.total;
  render();
}

// ---- driving (owner and admin only) ---------------------------------------------------
async function sendTurn(textarea) {
  const content = textarea.value;
  if (!content.trim()) return;
  try {
    const result = await api("POST", "/v1/sessions/" + state.session.id + "/turns",
                             { messages: [{ role: "user", content }] });
    textarea.value = "";
    const data = result.data;
    addDelta("turn", data);
    merge(data.messages, []);
    state.total = data.count;
    render();
  } catch (error) { showError(error.message); }
}

async function drive(action) {
  try {
    const result = await api("POST", "/v1/sessions/" + state.session.id + "/" + action);
    state.session = result.data;
    renderHead();
    if (action === "reset") { state.messages = new Map(); await loadPage(null); }
  } catch (error) { showError(error.message); }
}

// ---- the deltas of appends (MEM-14) ---------------------------------------------------
function addDelta(source, data) {
  const parts = ["+" + data.appended + " appended"];
  if (data.healed && data.healed.length) parts.push(data.healed.length + " healed (MEM-3)");
  if (data.replaced && data.replaced.length) parts.push(data.replaced.length + " late result (MEM-10)");
  if (data.edited && data.edited.length) parts.push(data.edited.length + " edited");
  if (data.removed && data.removed.length) parts.push(data.removed.length + " removed");
  const when = new Date().toLocaleTimeString();
  $("deltas").prepend(el("li", { testid: "delta", "data-source": source, "data-appended": String(data.appended),
                                 "data-count": String(data.count) },
    el("b", { text: parts.join(", ") }), " · count " + data.count + " · " + source + " · " + when));
}

// ---- live updates: server-sent events read with fetch (a bearer header, no cookie) ------
function stopStream() {
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.streamFor = null;
  setLive(false, "offline");
}

function setLive(on, text) {
  $("live").textContent = text;
  $("live").classList.toggle("on", on);
}

async function startStream(id) {
  const controller = new AbortController();
  state.stream = controller;
  state.streamFor = id;
  while (state.stream === controller) {
    try {
      const response = await fetch("/v1/sessions/" + id + "/events", {
        headers: { Authorization: "Bearer " + state.token, Accept: "text/event-stream" },
        credentials: "omit", cache: "no-store", signal: controller.signal });
      if (!response.ok) {
        if (response.status === 401) { signOut("Your token was refused."); return; }
        setLive(false, "offline");
        return;
      }
      setLive(true, "live");
      const ended = await readEvents(response.body, controller);
      if (ended === "gone") { setLive(false, "offline"); return; }
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    if (state.stream !== controller) return;
    setLive(false, "reconnecting");
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
}

async function readEvents(body, controller) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let ended = null;
  while (true) {
    const { value, done } = await reader.read();
    if (done || controller.signal.aborted) return ended;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (!data) continue;
      const payload = JSON.parse(data);
      if (event === "end") ended = payload.reason;
      else onEvent(event, payload);
    }
  }
}

function onEvent(event, data) {
  if (event === "snapshot" && data.count !== state.total) {
    loadPage(null);   // something happened while the stream was away
  } else if (event === "status") {
    state.session = { ...state.session, status: data.status };
    renderHead();
  } else if (event === "change") {
    if (data.removed.length && data.count === 0) state.messages = new Map();
    const news = merge(data.messages, data.removed);
    state.total = data.count;
    if (news || data.removed.length) addDelta("live", data);  // not again for this page's own turn
    render();
  }
}

function merge(items, removed) {
  let news = 0;
  for (const position of removed) state.messages.delete(position);
  for (const item of items) {
    const known = state.messages.get(item.position);
    if (!known || JSON.stringify(known) !== JSON.stringify(item.message)) {
      state.fresh.add(item.position);
      news += 1;
    }
    state.messages.set(item.position, item.message);
  }
  return news;
}

// ---- the transcript -------------------------------------------------------------------
function meta(message) { return message.metadata || {}; }
function isHealed(message) { return meta(message).healed === true; }
function callsOf(message) {
  const calls = message.tool_calls || meta(message).tool_calls;
  return Array.isArray(calls) ? calls : [];
}
function callId(call) { return call && (call.tool_call_id || call.id); }
function resultId(message) { return message.tool_call_id || meta(message).tool_call_id; }
// MEM-10: a result at a placeholder's slot (not a multiple of SLOT) that is no longer healed.
function isLate(position, message) {
  return message.role === "tool" && position % SLOT !== 0 && !isHealed(message);
}

function text(content) {
  if (typeof content === "string") return content;
  if (content === null || content === undefined) return "";  // a tool-call turn says nothing
  return JSON.stringify(content, null, 2);
}

function pretty(raw) {
  if (typeof raw !== "string") return JSON.stringify(raw, null, 2);
  try { return JSON.stringify(JSON.parse(raw), null, 2); } catch (_) { return raw; }
}

function resultBadge(position, message) {
  if (isHealed(message)) return el("span", { class: "badge healed", testid: "badge-healed",
    title: "The call never got a result; the next user turn healed it (MEM-3)" }, "healed placeholder");
  if (isLate(position, message)) return el("span", { class: "badge late", testid: "badge-late",
    title: "The real result arrived after the placeholder and replaced it in place (MEM-10)" },
    "late result · replaced placeholder");
  return null;
}

function render() {
  const ordered = [...state.messages.entries()].sort((a, b) => a[0] - b[0]);
  const results = new Map();   // call id -> [position, message]
  const names = new Map();     // call id -> tool name
  for (const [position, message] of ordered) {
    if (message.role === "tool" && resultId(message)) results.set(resultId(message), [position, message]);
    for (const call of callsOf(message)) names.set(callId(call), (call.function || {}).name || call.name || "?");
  }
  // 1, 2, 3 as a reader counts: the loaded messages are the newest of `total`
  const first = Math.max(state.total - ordered.length, 0) + 1;
  $("messages").replaceChildren(...ordered.map(([position, message], index) =>
    renderMessage(position, message, results, names, first + index)));
  state.fresh.clear();
  $("older").hidden = state.before === null || state.before === undefined;
  $("counts").textContent = "showing " + state.messages.size + " of " + state.total + " messages";
}

function renderMessage(position, message, results, names, number) {
  const classes = ["msg", "role-" + message.role];
  if (isHealed(message)) classes.push("healed");
  if (isLate(position, message)) classes.push("late");
  if (state.fresh.has(position)) classes.push("fresh");
  const head = el("header", {}, el("span", { class: "who", text: message.role }));
  if (message.role === "tool") {
    const id = resultId(message);
    head.append(el("span", { text: "result of " + (names.get(id) || "?") + " (" + id + ")" }));
    const badge = resultBadge(position, message);
    if (badge) head.append(badge);
  }
  if (meta(message).written_by) head.append(el("span", { text: "by " + meta(message).written_by }));
  head.append(el("span", { class: "pos", testid: "number", title: "stored position " + position,
                           text: String(number) }));
  const item = el("li", { class: classes.join(" "), testid: "message", "data-position": String(position),
                          "data-role": message.role }, head);
  const body = text(message.content);
  if (body !== "") item.append(el("pre", { class: "content", text: body }));
  for (const call of callsOf(message)) item.append(renderCall(call, results));
  return item;
}

function renderCall(call, results) {
  const id = callId(call);
  const fn = call.function || {};
  const card = el("div", { class: "call", testid: "call", "data-call-id": id },
    el("span", { class: "name", text: fn.name || call.name || "(unnamed)" }), " ",
    el("span", { class: "id", text: id }),
    el("div", { class: "label", text: "arguments" }),
    el("pre", { testid: "arguments", text: pretty(fn.arguments !== undefined ? fn.arguments : call.arguments || "") }));
  const found = results.get(id);
  card.append(el("div", { class: "label", text: "result" }));
  if (!found) {
    card.append(el("span", { class: "badge pending", testid: "badge-pending", text: "no result yet" }));
  } else {
    const [position, message] = found;
    const badge = resultBadge(position, message);
    if (badge) card.append(badge);
    card.append(el("pre", { testid: "result", text: text(message.content) }));
  }
  return card;
}

// ---- wiring ---------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim());
  });
  $("signout").addEventListener("click", () => signOut(""));
  $("older").addEventListener("click", () => loadPage(state.before));
  $("open-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("open-id").value.trim();
    if (id) openSession(id);
  });
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved); else showSignIn("");
});
