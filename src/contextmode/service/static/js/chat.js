// The chat pane: history, the user's bubbles (with image thumbnails) and the streaming answer.

import { $, clear, el } from "./dom.js";
import { t } from "./i18n.js";

const list = () => $("#messages");

function scrollToEnd() {
  const node = list();
  node.scrollTop = node.scrollHeight;
}

/** The bubble's header: "turn n · role", and for a past user message a button that opens
 * what the model received for that turn (`data-open-turn`, handled in app.js). */
function meta(role, exchange) {
  const label = el("span", { class: "meta-label" }, exchange ? t("turn", exchange, role) : "");
  const open = role === "user" && exchange
    ? el("button", { type: "button", class: "open-turn link-button", dataset: { openTurn: exchange }, "aria-label": t("viewTurnLabel", exchange) }, t("viewTurn"))
    : null;
  return el("div", { class: "message-meta" }, label, open);
}

function bubble(role, seq, exchange, ...children) {
  return el(
    "li",
    { class: `message ${role}`, id: seq != null ? `turn-${seq}` : null, dataset: exchange ? { role, seq, turn: exchange } : { role, seq } },
    meta(role, exchange),
    ...children,
  );
}

/** How many personal values were masked in a stored turn (pii="mask"), or nothing. */
function maskedNote(counts) {
  const n = counts ? Object.values(counts).reduce((a, b) => a + b, 0) : 0;
  return n ? el("div", { class: "muted pii-note" }, t("piiMasked", n)) : null;
}

/** Show a stored history (oldest first). */
export function renderHistory(turns) {
  if (!turns.length) {
    clear(list(), el("li", { class: "empty" }, t("emptyChat")));
    return;
  }
  clear(
    list(),
    turns.map((turn) => {
      const count = turn.metadata?.image_count;
      const node = bubble(
        turn.role,
        turn.seq,
        turn.metadata?.turn || null,
        count ? el("div", { class: "image-note" }, `🖼 ${t("imagesAttached", count)}`) : null,
        el("div", { class: "message-text" }, turn.content),
        turn.tool_calls?.length
          ? el("div", { class: "tool-calls muted" }, turn.tool_calls.map((c) => `🔧 ${c.name}(${c.arguments})`).join("\n"))
          : null,
        turn.partial ? el("div", { class: "muted" }, t("partial")) : null,
        maskedNote(turn.metadata?.pii_masked),
        turn.metadata?.notice ? el("div", { class: "muted notice-note" }, t("notice")) : null,
      );
      node.dataset.state = turn.partial ? "partial" : "done";
      // An engine notice (no model configured) is shown as such: it is not an answer.
      if (turn.metadata?.notice) node.classList.add("notice");
      return node;
    }),
  );
  scrollToEnd();
}

/** Append the user's message (images as thumbnails); returns a handle to number it later. */
export function addUserMessage(text, images) {
  list().querySelector(".empty")?.remove();
  const node = bubble(
    "user",
    null,
    null,
    images.length ? el("div", { class: "thumbs" }, images.map((src) => el("img", { src, alt: "" }))) : null,
    el("div", { class: "message-text" }, text),
  );
  list().append(node);
  scrollToEnd();
  return {
    number(seq, exchange) {
      node.id = `turn-${seq}`;
      node.dataset.seq = seq;
      if (exchange) node.dataset.turn = exchange;
      node.querySelector(".message-meta").replaceWith(meta("user", exchange));
    },
    remove() {
      node.remove();
    },
  };
}

/** Append an empty assistant bubble and return methods to stream into it. */
export function startAnswer() {
  const text = el("div", { class: "message-text" });
  const info = el("div", { class: "turn-meta muted" });
  const node = bubble("assistant", null, null, text, info);
  node.dataset.state = "streaming";
  node.dataset.deltas = "0"; // SSE delta events received: the answer arrived in this many pieces
  node.setAttribute("aria-busy", "true");
  list().append(node);
  scrollToEnd();
  return {
    append(delta) {
      node.dataset.deltas = String(Number(node.dataset.deltas) + 1);
      text.append(delta);
      scrollToEnd();
    },
    finish(done, tokens) {
      node.dataset.state = "done";
      node.removeAttribute("aria-busy");
      if (done.seq != null) {
        node.id = `turn-${done.seq}`;
        node.dataset.seq = done.seq;
        node.querySelector(".message-meta").replaceWith(meta("assistant", done.turn));
      }
      if (done.partial) text.after(el("div", { class: "muted" }, t("partial")));
      const ttft = done.ttft_ms == null ? null : Math.round(done.ttft_ms);
      info.textContent = t("turnMeta", { ttft, tokens, jobs: done.jobs });
      scrollToEnd(); // the lines added below the text must not be left under the fold
    },
    fail(message, partial) {
      node.dataset.state = "error";
      node.removeAttribute("aria-busy");
      node.classList.add("error");
      // The server stored what was streamed before the failure and sends it again: show it, marked.
      if (partial) {
        if (!text.textContent) text.append(partial);
        node.dataset.interrupted = "true";
        text.after(el("div", { class: "muted" }, t("interrupted")));
      }
      text.after(el("div", { class: "error-text" }, `${t("error")}: ${message}`));
      scrollToEnd();
    },
  };
}

/** An error that happened before any answer (bad request, auth, store down). */
export function addError(message) {
  list().append(el("li", { class: "message error", role: "alert", dataset: { state: "error" } }, el("div", { class: "error-text" }, `${t("error")}: ${message}`)));
  scrollToEnd();
}

/** Flash the bubble of turn `seq` (clicked from a constraint's source link). */
export function highlightTurn(seq) {
  const node = document.getElementById(`turn-${seq}`);
  if (!node) return;
  node.scrollIntoView({ block: "center", behavior: "smooth" });
  node.classList.add("highlight");
  setTimeout(() => node.classList.remove("highlight"), 1600);
}
