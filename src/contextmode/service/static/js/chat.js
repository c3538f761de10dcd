// The chat pane: history, the user's bubbles (with image thumbnails) and the streaming answer.

import { $, clear, el } from "./dom.js";
import { t } from "./i18n.js";

const list = () => $("#messages");

function scrollToEnd() {
  const node = list();
  node.scrollTop = node.scrollHeight;
}

function bubble(role, seq, ...children) {
  return el(
    "li",
    { class: `message ${role}`, id: seq != null ? `turn-${seq}` : null, dataset: { role, seq } },
    el("div", { class: "message-meta" }, seq != null ? t("turn", seq, role) : ""),
    ...children,
  );
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
        count ? el("div", { class: "image-note" }, `🖼 ${t("imagesAttached", count)}`) : null,
        el("div", { class: "message-text" }, turn.content),
        turn.tool_calls?.length
          ? el("div", { class: "tool-calls muted" }, turn.tool_calls.map((c) => `🔧 ${c.name}(${c.arguments})`).join("\n"))
          : null,
        turn.partial ? el("div", { class: "muted" }, t("partial")) : null,
      );
      node.dataset.state = turn.partial ? "partial" : "done";
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
    images.length ? el("div", { class: "thumbs" }, images.map((src) => el("img", { src, alt: "" }))) : null,
    el("div", { class: "message-text" }, text),
  );
  list().append(node);
  scrollToEnd();
  return {
    number(seq) {
      node.id = `turn-${seq}`;
      node.dataset.seq = seq;
      node.querySelector(".message-meta").textContent = t("turn", seq, "user");
    },
  };
}

/** Append an empty assistant bubble and return methods to stream into it. */
export function startAnswer() {
  const text = el("div", { class: "message-text" });
  const meta = el("div", { class: "turn-meta muted" });
  const node = bubble("assistant", null, text, meta);
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
        node.querySelector(".message-meta").textContent = t("turn", done.seq, "assistant");
      }
      if (done.partial) text.after(el("div", { class: "muted" }, t("partial")));
      const ttft = done.ttft_ms == null ? null : Math.round(done.ttft_ms);
      meta.textContent = t("turnMeta", { ttft, tokens, jobs: done.jobs });
    },
    fail(message) {
      node.dataset.state = "error";
      node.removeAttribute("aria-busy");
      node.classList.add("error");
      text.after(el("div", { class: "error-text" }, `${t("error")}: ${message}`));
    },
  };
}

/** An error that happened before any answer (bad request, auth, store down). */
export function addError(message) {
  list().append(el("li", { class: "message error", dataset: { state: "error" } }, el("div", { class: "error-text" }, `${t("error")}: ${message}`)));
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
