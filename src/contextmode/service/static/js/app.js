// Wiring of the inspector page: session picker, composer, streaming turns, polling of
// background jobs, API key and language. Everything goes through the public API (api.js).

import { ApiError, apiKey, getSession, listSessions, previewContext, readAsDataURL, setApiKey, streamMessage } from "./api.js";
import { addError, addUserMessage, highlightTurn, renderHistory, startAnswer } from "./chat.js";
import { $, clear, el } from "./dom.js";
import { applyStatic, currentLang, setLang, t } from "./i18n.js";
import { renderContext, renderSession } from "./inspector.js";

const POLL_MS = 400;
const POLL_LIMIT = 40; // ≈16 s of polling while background jobs are pending

const state = {
  sessionId: null,
  session: null, // GET /v1/sessions/{id} data, or null for a session with no turn yet
  ctx: null, // the last context shown (SSE context event or a preview)
  source: null, // {kind: "turn", seq} | {kind: "preview"}
  currentSeq: null, // the user turn of the last streamed answer
  images: [], // data URLs waiting to be sent
  sending: false,
  pollToken: 0, // bumped by each session load: an older poll stops
  openToken: 0, // bumped by each session open and each send: an older open does not redraw
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function newSessionId() {
  const stamp = new Date().toISOString().replace(/[-:T]/g, "").slice(0, 14);
  return `web-${stamp}-${Math.random().toString(36).slice(2, 6)}`;
}

function emptySession(id) {
  return {
    session_id: id, last_seq: 0, turns: [], summary: null, constraints: [], last_answer: null,
    stats: { summary_covers_seq: 0, summary_version: 0, constraints_version: 0, jobs: {}, pending_jobs: [] },
  };
}

// -- errors and the API key ------------------------------------------------------------

function askForKey() {
  const dialog = $("#key-dialog");
  $("#key-input").value = apiKey();
  if (!dialog.open) dialog.showModal();
}

function handleError(error) {
  if (error instanceof ApiError && error.unauthorized) askForKey();
  addError(error instanceof ApiError ? `${error.message} (${error.code})` : String(error.message ?? error));
}

// -- rendering ---------------------------------------------------------------------------

function renderInspector() {
  renderContext(state.ctx, state.source);
  renderSession(state.session ?? emptySession(state.sessionId), state.ctx, state.currentSeq);
  // What the page last loaded, for anyone (tests included) waiting for the view to catch up.
  document.body.dataset.jobs = state.session?.stats.pending_jobs.length ? "pending" : "idle";
  document.body.dataset.lastSeq = String(state.session?.last_seq ?? 0);
}

async function refreshSessionList() {
  const select = $("#session-select");
  let sessions = [];
  try {
    sessions = (await listSessions()).sessions;
  } catch (error) {
    if (error instanceof ApiError && error.unauthorized) askForKey();
    else throw error;
  }
  const ids = sessions.map((s) => s.session_id);
  if (state.sessionId && !ids.includes(state.sessionId)) ids.unshift(state.sessionId);
  clear(select, ids.length ? ids.map((id) => el("option", { value: id }, id)) : el("option", { value: "" }, t("noSessions")));
  select.value = state.sessionId ?? "";
}

/** Load the session from the API; while jobs are pending, poll until they finish. */
async function refreshSession({ poll = false } = {}) {
  const token = ++state.pollToken;
  for (let attempt = 0; attempt < (poll ? POLL_LIMIT : 1); attempt += 1) {
    let session = null;
    try {
      session = await getSession(state.sessionId);
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) throw error; // 404: no turn yet
    }
    if (token !== state.pollToken) return; // a newer load (another session, a new turn) won
    state.session = session;
    renderInspector();
    if (!state.session?.stats.pending_jobs.length) return;
    await sleep(POLL_MS);
    if (token !== state.pollToken) return;
  }
}

async function openSession(id) {
  const opened = ++state.openToken;
  state.sessionId = id;
  state.ctx = null;
  state.source = null;
  state.currentSeq = null;
  localStorage.setItem("contextmode.session", id);
  history.replaceState(null, "", `#session=${encodeURIComponent(id)}`);
  $("#session-select").value = id;
  try {
    await refreshSession();
  } catch (error) {
    handleError(error);
  }
  // A message sent (or another session opened) meanwhile owns the view now.
  if (opened !== state.openToken || state.sending) return;
  renderHistory(state.session?.turns ?? []);
  renderInspector();
  if (state.session?.stats.pending_jobs.length) refreshSession({ poll: true }).catch(handleError);
}

// -- sending -----------------------------------------------------------------------------

function setSending(sending) {
  state.sending = sending;
  document.body.dataset.sending = sending ? "yes" : "no";
  const button = $("#send-button");
  button.disabled = sending;
  button.textContent = sending ? t("sending") : t("send");
  $("#preview-button").disabled = sending;
}

function renderAttachments() {
  clear(
    $("#attachments"),
    state.images.map((src, index) =>
      el(
        "span",
        { class: "attachment" },
        el("img", { src, alt: "" }),
        el("button", { type: "button", class: "remove", title: t("removeImage"), "aria-label": t("removeImage"), onclick: () => { state.images.splice(index, 1); renderAttachments(); } }, "×"),
      ),
    ),
  );
}

async function send() {
  const input = $("#message-input");
  const text = input.value.trim();
  if (!text || state.sending) return;
  const images = state.images.slice();
  const mode = $("#mode-select").value || undefined;
  state.openToken += 1;
  state.pollToken += 1; // a poll still running for the previous turn must not redraw mid-stream
  setSending(true);
  const user = addUserMessage(text, images);
  input.value = "";
  state.images = [];
  renderAttachments();
  let answer = null;
  try {
    const expectedSeq = (state.session?.last_seq ?? 0) + 1;
    for await (const event of streamMessage(state.sessionId, { message: text, images, mode })) {
      if (event.type === "context") {
        state.ctx = event;
        state.source = { kind: "turn", seq: expectedSeq };
        state.currentSeq = expectedSeq;
        answer = startAnswer();
        renderInspector();
      } else if (event.type === "delta") {
        answer?.append(event.text);
      } else if (event.type === "done") {
        user.number(event.user_seq);
        state.currentSeq = event.user_seq;
        state.source = { kind: "turn", seq: event.user_seq };
        answer?.finish(event, state.ctx?.total_tokens);
      } else if (event.type === "error") {
        answer?.fail(`${event.msg} (${event.code})`);
      }
    }
  } catch (error) {
    if (answer) answer.fail(error.message);
    else handleError(error);
  } finally {
    setSending(false);
  }
  try {
    await refreshSessionList();
    // Constraint extraction, the summary and emotion scoring run after the answer: poll.
    await refreshSession({ poll: true });
  } catch (error) {
    handleError(error);
  }
}

async function preview() {
  const draft = $("#message-input").value.trim() || "…";
  try {
    state.ctx = await previewContext(state.sessionId, draft, $("#mode-select").value || undefined);
    state.source = { kind: "preview" };
    renderInspector();
  } catch (error) {
    handleError(error);
  }
}

// -- wiring ------------------------------------------------------------------------------

function applyLanguage() {
  applyStatic();
  $("#lang-toggle").textContent = t("langToggle");
  $("#send-button").textContent = state.sending ? t("sending") : t("send");
  if (state.session) renderHistory(state.session.turns);
  renderInspector();
}

function initialSession() {
  const match = location.hash.match(/session=([^&]+)/);
  if (match) return decodeURIComponent(match[1]);
  return localStorage.getItem("contextmode.session") || newSessionId();
}

function wire() {
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("#message-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $("#preview-button").addEventListener("click", preview);
  $("#image-input").addEventListener("change", async (event) => {
    for (const file of event.target.files) state.images.push(await readAsDataURL(file));
    event.target.value = "";
    renderAttachments();
  });
  $("#session-select").addEventListener("change", (event) => event.target.value && openSession(event.target.value));
  $("#new-session").addEventListener("click", async () => {
    state.sessionId = newSessionId();
    await refreshSessionList();
    await openSession(state.sessionId);
    $("#message-input").focus();
  });
  $("#lang-toggle").addEventListener("click", () => {
    setLang(currentLang() === "zh" ? "en" : "zh");
    applyLanguage();
  });
  $("#key-button").addEventListener("click", askForKey);
  $("#key-dialog").addEventListener("close", async () => {
    const choice = $("#key-dialog").returnValue;
    if (choice === "save") setApiKey($("#key-input").value.trim());
    else if (choice === "forget") setApiKey("");
    else return;
    await refreshSessionList();
    await openSession(state.sessionId);
  });
  document.addEventListener("click", (event) => {
    const link = event.target.closest?.(".constraint-source");
    if (!link) return;
    event.preventDefault();
    highlightTurn(Number(link.closest("li").dataset.sourceSeq));
  });
}

async function main() {
  wire();
  applyLanguage();
  state.sessionId = initialSession();
  setSending(false);
  try {
    await refreshSessionList();
  } catch (error) {
    handleError(error);
  }
  await openSession(state.sessionId);
  document.body.dataset.ready = "yes";
}

main();
