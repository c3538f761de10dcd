// Wiring of the inspector page: session picker, composer, streaming turns, polling of
// background jobs, API key and language. Everything goes through the public API (api.js).
//
// Opening a session, sending a message and previewing run one after another (`serial`), so a
// slow load can never redraw the chat over a turn sent meanwhile. Polling for background jobs
// runs beside them and only ever redraws the inspector.
//
// Several tabs (or clients) on one session: a tab that finishes a turn tells the others
// (BroadcastChannel), and an idle, visible page checks every FOLLOW_MS whether the session
// moved; either way the page reloads the session and redraws the chat when it shows
// something else than the stored history, so turns never interleave or go missing.

import { ApiError, apiKey, getSession, getTurnContext, listSessions, previewContext, readAsDataURL, setApiKey, streamMessage } from "./api.js";
import { addError, addUserMessage, highlightTurn, renderHistory, startAnswer } from "./chat.js";
import { $, clear, el } from "./dom.js";
import { applyStatic, currentLang, setLang, t } from "./i18n.js";
import { renderContext, renderSession, traceContext, useSession } from "./inspector.js";

const POLL_MS = 400; // while background jobs are pending: every 0.4 s for the first 8 s,
const POLL_SLOW_MS = 2000; // then every 2 s (a busy server's jobs can take longer),
const POLL_LIMIT = 170; // ≈5.5 min in all, so a page left open does not poll for ever
const FOLLOW_MS = 2000; // an idle, visible page checks this often for turns made elsewhere
const channel = typeof BroadcastChannel === "function" ? new BroadcastChannel("contextmode.turns") : null;

const state = {
  sessionId: null,
  session: null, // GET /v1/sessions/{id} data, or null for a session with no turn yet
  ctx: null, // the last context shown (SSE context event or a preview)
  source: null, // {kind: "turn", turn} (as sent now) | {kind: "past", turn} (kept trace) | {kind: "preview"}
  currentSeq: null, // the user turn of the last streamed answer
  images: [], // data URLs waiting to be sent
  sending: false,
  pollToken: 0, // bumped by every load of the session: an older poll stops
  view: 0, // bumped when another session is opened: a stream still running for the old one stops drawing
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let queue = Promise.resolve();
let queued = 0;

/** The busy indicator (a moving bar at the top) and the inspector's aria-busy. */
function setBusy(busy) {
  document.body.dataset.busy = busy ? "yes" : "no";
  $(".pane.inspector")?.setAttribute("aria-busy", busy ? "true" : "false");
}

/** Run `task` after every task queued before it; the page is "busy" while any is queued. */
function serial(task) {
  queued += 1;
  setBusy(true);
  const run = queue.then(task).catch(handleError).finally(() => {
    queued -= 1;
    if (queued === 0) setBusy(false);
  });
  queue = run;
  return run;
}

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
  if (dialog.open) return;
  $("#key-input").value = apiKey();
  dialog.showModal();
}

function handleError(error) {
  if (error instanceof ApiError && error.unauthorized) {
    askForKey(); // the dialog says what is needed; no error bubble
    return;
  }
  addError(error instanceof ApiError ? `${error.message} (${error.code})` : String(error?.message ?? error));
}

// -- rendering ---------------------------------------------------------------------------

function renderInspector() {
  useSession(state.session);
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
    if (!(error instanceof ApiError && error.unauthorized)) throw error;
    askForKey();
  }
  const ids = sessions.map((s) => s.session_id);
  // A framework's key (stored under an id made from it) is shown as the framework gave it.
  const keys = new Map(sessions.map((s) => [s.session_id, s.key ?? s.session_id]));
  if (state.sessionId && !ids.includes(state.sessionId)) ids.unshift(state.sessionId);
  clear(select, ids.length ? ids.map((id) => el("option", { value: id }, keys.get(id) ?? id)) : el("option", { value: "" }, t("noSessions")));
  select.value = state.sessionId ?? "";
}

/**
 * Load the session (a 404 is a session with no turn yet); true when this load was still the
 * newest when it answered. A poll passes its own `token` so that it does not outdate itself.
 */
async function loadSession(token = ++state.pollToken) {
  let session = null;
  try {
    session = await getSession(state.sessionId);
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 404)) throw error;
  }
  if (token !== state.pollToken) return false;
  state.session = session;
  renderInspector();
  return true;
}

/** Poll the session while background jobs are pending (constraints, summary, emotion). */
async function pollJobs() {
  const token = state.pollToken;
  for (let attempt = 0; attempt < POLL_LIMIT && state.session?.stats.pending_jobs.length; attempt += 1) {
    await sleep(attempt < 20 ? POLL_MS : POLL_SLOW_MS);
    if (token !== state.pollToken) return; // a newer load (another session, a new turn) took over
    try {
      if (!(await loadSession(token))) return;
    } catch (error) {
      handleError(error);
      return;
    }
  }
}

/** The seqs of the bubbles the chat shows, in order (bubbles not numbered yet left out). */
function shownSeqs() {
  return [...document.querySelectorAll("#messages .message")].map((node) => Number(node.dataset.seq)).filter(Number.isFinite);
}

/** True when the chat shows exactly the loaded history (from its first turn on). */
function historyShown(session) {
  const stored = (session?.turns ?? []).map((turn) => turn.seq);
  const shown = shownSeqs().filter((seq) => seq >= (stored[0] ?? 1));
  return shown.length === stored.length && shown.every((seq, i) => seq === stored[i]);
}

/** Catch up with turns made elsewhere: reload the session, redraw the chat if it differs. */
async function follow() {
  const view = state.view;
  if (state.sending || !(await loadSession())) return;
  if (view !== state.view || state.sending) return;
  if (!historyShown(state.session)) renderHistory(state.session?.turns ?? []);
  pollJobs();
}

/** Has the session moved since this page loaded it? One small read; catch up when it has. */
async function checkForTurns() {
  if (state.sending || queued > 0 || document.visibilityState !== "visible" || !state.sessionId) return;
  let latest = null;
  try {
    latest = await getSession(state.sessionId, 1);
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 404)) return; // the next check retries
  }
  if ((latest?.last_seq ?? 0) !== (state.session?.last_seq ?? 0) && !state.sending) serial(follow);
}

async function openSession(id) {
  state.view += 1;
  state.sessionId = id;
  state.session = null;
  state.ctx = null;
  state.source = null;
  state.currentSeq = null;
  localStorage.setItem("contextmode.session", id);
  history.replaceState(null, "", `#session=${encodeURIComponent(id)}`);
  $("#session-select").value = id;
  try {
    await loadSession();
  } finally {
    renderHistory(state.session?.turns ?? []);
    renderInspector();
  }
  await showNewestTurn();
  pollJobs();
}

/** After a load or reload, the inspector shows the newest exchange as the model received it
 * (its kept trace), not a blank pane; nothing when no trace was kept. */
async function showNewestTurn() {
  const turns = state.session?.turns ?? [];
  const newest = turns.findLast((turn) => turn.role === "user" && turn.metadata?.turn)?.metadata.turn;
  if (!newest || state.ctx) return;
  try {
    await openTurn(newest, { focus: false });
  } catch (error) {
    if (!(error instanceof ApiError && error.status === 404)) throw error;
  }
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

/** Take the composer's text and images now; stream the turn when its place in the queue comes. */
function send() {
  const input = $("#message-input");
  const draft = input.value;
  const text = draft.trim();
  if (!text || state.sending) return;
  const images = state.images.slice();
  const mode = $("#mode-select").value || undefined;
  input.value = "";
  state.images = [];
  renderAttachments();
  setSending(true);
  // The session is fixed now: switching sessions later never redirects this message.
  const sessionId = state.sessionId;
  serial(() => streamTurn(sessionId, { text, draft, images, mode }));
}

/** A send the server refused before storing anything: the draft comes back to the composer. */
function restoreDraft(message) {
  const input = $("#message-input");
  if (input.value.trim()) return; // the user already typed something new: keep that
  input.value = message.draft;
  state.images = message.images;
  renderAttachments();
}

async function streamTurn(sessionId, message) {
  state.pollToken += 1; // a poll still running for the previous turn must not redraw mid-stream
  const view = state.view;
  const shown = () => view === state.view; // false once the user opened another session
  const user = shown() && state.sessionId === sessionId ? addUserMessage(message.text, message.images) : null;
  let answer = null;
  let started = false;
  let finished = false; // the done event came: both bubbles carry their stored numbers
  try {
    const expectedSeq = (state.session?.last_seq ?? 0) + 1;
    const body = { message: message.text, images: message.images, mode: message.mode };
    for await (const event of streamMessage(sessionId, body)) {
      started = true;
      if (!shown() || !user) continue; // keep reading: the server stores the answer either way
      if (event.type === "context") {
        state.ctx = event;
        state.source = { kind: "turn", turn: null };
        state.currentSeq = expectedSeq;
        answer = startAnswer();
        renderInspector();
      } else if (event.type === "delta") {
        answer?.append(event.text);
      } else if (event.type === "done") {
        finished = true;
        user.number(event.user_seq, event.turn);
        state.currentSeq = event.user_seq;
        state.source = { kind: "turn", turn: event.turn };
        answer?.finish(event, state.ctx?.total_tokens);
      } else if (event.type === "error") {
        answer?.fail(`${event.msg} (${event.code})`, event.partial_answer);
      }
    }
  } catch (error) {
    if (!started) restoreDraft(message); // nothing was stored: the words are not lost
    if (answer && shown()) answer.fail(error.message);
    else handleError(error);
    if (!started) user?.remove();
  } finally {
    setSending(false);
  }
  if (!shown()) return;
  await refreshSessionList();
  // Constraint extraction, the summary and emotion scoring run after the answer: poll.
  if (await loadSession()) {
    // Another tab's turns may have landed around this one: show the stored order. (A failed
    // turn's bubbles are not numbered: they stay as drawn, with their error.)
    if (finished && !historyShown(state.session)) renderHistory(state.session?.turns ?? []);
    channel?.postMessage({ session: sessionId, lastSeq: state.session?.last_seq ?? 0 });
    pollJobs();
  }
}

/** Show what the model received at exchange `turn` (the kept trace), for a past turn. */
async function openTurn(turn, { focus = true } = {}) {
  const view = state.view;
  const trace = await getTurnContext(state.sessionId, turn);
  if (view !== state.view) return;
  state.ctx = traceContext(trace);
  state.source = { kind: "past", turn };
  state.currentSeq = trace.user_seq;
  renderInspector();
  if (focus) $("#context-source")?.focus();
}

async function preview() {
  const draft = $("#message-input").value.trim() || "…";
  state.ctx = await previewContext(state.sessionId, draft, $("#mode-select").value || undefined);
  state.source = { kind: "preview" };
  renderInspector();
}

// -- wiring ------------------------------------------------------------------------------

/** Open another session: at once while a reply streams (the stream goes on for its own session,
 * unseen), else in its place in the queue. */
function switchSession(task) {
  if (state.sending) task().catch(handleError);
  else serial(task);
}

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
  $("#preview-button").addEventListener("click", () => serial(preview));
  $("#image-input").addEventListener("change", async (event) => {
    for (const file of event.target.files) state.images.push(await readAsDataURL(file));
    event.target.value = "";
    renderAttachments();
  });
  $("#session-select").addEventListener("change", (event) => {
    const id = event.target.value;
    if (id) switchSession(() => openSession(id));
  });
  $("#new-session").addEventListener("click", () =>
    switchSession(async () => {
      state.sessionId = newSessionId();
      await refreshSessionList();
      await openSession(state.sessionId);
      $("#message-input").focus();
    }),
  );
  $("#lang-toggle").addEventListener("click", () => {
    setLang(currentLang() === "zh" ? "en" : "zh");
    applyLanguage();
  });
  $("#key-button").addEventListener("click", askForKey);
  channel?.addEventListener("message", (event) => {
    const { session, lastSeq } = event.data ?? {};
    if (session === state.sessionId && lastSeq !== (state.session?.last_seq ?? 0) && !state.sending) serial(follow);
  });
  document.addEventListener("visibilitychange", checkForTurns);
  setInterval(checkForTurns, FOLLOW_MS);
  $("#key-dialog").addEventListener("close", () => {
    const choice = $("#key-dialog").returnValue;
    if (choice !== "save" && choice !== "forget") return;
    setApiKey(choice === "save" ? $("#key-input").value.trim() : "");
    serial(async () => {
      await refreshSessionList();
      await openSession(state.sessionId);
    });
  });
  // The skip link focuses the composer without changing the URL (which names the session).
  $(".skip-link").addEventListener("click", (event) => {
    event.preventDefault();
    $("#message-input").focus();
  });
  document.addEventListener("click", (event) => {
    const opener = event.target.closest?.("[data-open-turn]");
    if (opener) {
      serial(() => openTurn(Number(opener.dataset.openTurn)));
      return;
    }
    const link = event.target.closest?.(".constraint-source");
    if (!link) return;
    event.preventDefault();
    highlightTurn(Number(link.closest("li").dataset.sourceSeq));
  });
}

function main() {
  wire();
  applyLanguage();
  state.sessionId = initialSession();
  setSending(false);
  serial(async () => {
    await refreshSessionList();
    await openSession(state.sessionId);
  }).finally(() => {
    document.body.dataset.ready = "yes";
  });
}

main();
