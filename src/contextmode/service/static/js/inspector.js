// The inspector pane: what the model received for a turn (layers and their tokens, the
// rewrite, dropped turns) and the session around it (constraints, summary, jobs, timeline).

import { getStorage } from "./api.js";
import { $, clear, el } from "./dom.js";
import { layerLabel, recordKind, t } from "./i18n.js";

/** The exchange number of stored turn `seq` (turn n = the n-th user message), from its stamp. */
export function exchangeOf(session, seq) {
  const turn = session?.turns.find((candidate) => candidate.seq === seq);
  return turn?.metadata?.turn || null;
}

// Stored turn seq → [exchange number, role] of the session shown: the page names every turn
// by its exchange ("第 3 轮", "第 3 轮的回答"), as the bubbles do, never by storage number.
let numbering = new Map();

/** Name turns after `session`'s exchange numbers from now on (call before drawing). */
export function useSession(session) {
  numbering = new Map((session?.turns ?? []).map((turn) => [turn.seq, [turn.metadata?.turn || null, turn.role]]));
}

/** Stored turn `seq` by its exchange ("第 3 轮" / "第 3 轮的回答"); "#seq" only for a turn the
 * page has not loaded (older than the newest 200). */
export function turnRef(seq) {
  const [n, role] = numbering.get(seq) ?? [null, null];
  return n ? t("turnRef", n, role) : `#${seq}`;
}

/** A kept trace (GET …/turns/{n}/context) in the shape the context view draws. */
export function traceContext(trace) {
  return {
    message: trace.sent,
    original_message: trace.typed,
    mode: trace.mode,
    strategy: trace.strategy,
    format: trace.format,
    locale: trace.locale,
    input_budget: trace.input_budget,
    reply_reserve: trace.reply_reserve,
    total_tokens: trace.total_tokens,
    exact: trace.exact,
    counter: trace.counter,
    layers: trace.layers.map((layer) => ({ ...layer, title: null })),
    dropped_seqs: [...new Set(trace.layers.flatMap((layer) => layer.dropped_seqs))].sort((a, b) => a - b),
    detection: { needs_context: trace.needs_context, intent: trace.intent, score: trace.detection_score, reason: trace.detection_reason },
    rewrite: trace.rewrite,
    messages: trace.messages,
    recalled: trace.recalled,
    prepare_ms: trace.prepare_ms,
    usage: trace.usage ?? null,
    trace,
  };
}

const TEMPLATE_INTENTS = new Set(["detail", "simplify", "example", "summary"]);

/** What happened to the typed message: "rewrite" (the model got the rewrite), "template" (a
 * follow-up answered from the last answer: not a rewrite), "hint" (a verified rewrite given
 * beside the user's words, which the model received verbatim), or "none". */
function messageFate(ctx) {
  const changed = ctx.message !== ctx.original_message;
  if (changed && ctx.rewrite?.changed && ctx.message === ctx.rewrite.text) return "rewrite";
  if (changed && TEMPLATE_INTENTS.has(ctx.detection?.intent)) return "template";
  // Contextual mode: the model gets the user's words verbatim and a verified rewrite only
  // as a labelled hint beside them.
  if (ctx.rewrite?.changed && !changed) return "hint";
  return changed ? "template" : "none";
}

/** Character diff of `a` → `b` as [kind, text] runs (kind: "same" | "del" | "ins"), by LCS;
 * long texts fall back to the common prefix and suffix. */
export function diffText(a, b) {
  const x = [...a];
  const y = [...b];
  let start = 0;
  while (start < x.length && start < y.length && x[start] === y[start]) start += 1;
  let endX = x.length;
  let endY = y.length;
  while (endX > start && endY > start && x[endX - 1] === y[endY - 1]) { endX -= 1; endY -= 1; }
  const runs = [];
  const push = (kind, text) => {
    if (!text) return;
    const last = runs[runs.length - 1];
    if (last && last[0] === kind) last[1] += text;
    else runs.push([kind, text]);
  };
  push("same", x.slice(0, start).join(""));
  const midX = x.slice(start, endX);
  const midY = y.slice(start, endY);
  if (midX.length * midY.length > 4_000_000) {
    push("del", midX.join(""));
    push("ins", midY.join(""));
  } else {
    const n = midX.length;
    const m = midY.length;
    const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        lcs[i][j] = midX[i] === midY[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && midX[i] === midY[j]) { push("same", midX[i]); i += 1; j += 1; }
      else if (j < m && (i === n || lcs[i][j + 1] >= lcs[i + 1][j])) { push("ins", midY[j]); j += 1; }
      else { push("del", midX[i]); i += 1; }
    }
  }
  push("same", x.slice(endX).join(""));
  return runs;
}

/** The message the model received as the user's turn: the last user message sent. */
function receivedMessage(ctx) {
  const users = (ctx.messages ?? []).filter((m) => m.role === "user");
  return users.length ? users[users.length - 1].content : ctx.message;
}

function diffCard(ctx) {
  const received = receivedMessage(ctx);
  const runs = diffText(ctx.original_message, received);
  const same = runs.every(([kind]) => kind === "same");
  return el(
    "section",
    { class: "card", id: "turn-diff", dataset: { same: same ? "yes" : "no" } },
    el("h3", {}, t("diffTitle")),
    el("p", { class: "muted" }, same ? t("diffSame") : t("diffHelp")),
    el(
      "p",
      { class: "quote diff", id: "diff-text" },
      runs.map(([kind, text]) => (kind === "same" ? el("span", {}, text) : el(kind, { title: t(kind === "ins" ? "diffIns" : "diffDel") }, text))),
    ),
  );
}

function sourceLabel(source) {
  if (source.kind === "preview") return t("sourcePreview");
  if (source.kind === "past") return t("sourcePast", source.turn);
  return source.turn ? t("sourceTurn", source.turn) : t("sourceSending");
}

function rewriteCard(ctx) {
  const fate = messageFate(ctx);
  const shown = {
    rewrite: [t("standalone"), ctx.message],
    template: [t("templateTitle", ctx.detection?.intent ?? ""), t("templateNote")],
    hint: [t("hint"), ctx.rewrite?.text ?? ""],
    none: [t("standalone"), t("notRewritten")],
  }[fate];
  return el(
    "section",
    { class: "card", id: "rewrite-card", dataset: { rewritten: fate === "rewrite" ? "yes" : "no", fate } },
    el("h3", {}, t("rewrite")),
    el(
      "div",
      { class: "rewrite-grid" },
      el("div", {}, el("h4", {}, t("original")), el("p", { class: "quote", id: "original-message" }, ctx.original_message)),
      el("div", { class: fate === "rewrite" ? "rewritten" : "same" }, el("h4", {}, shown[0]), el("p", { class: "quote", id: "standalone-message" }, shown[1])),
    ),
    el("p", { class: "muted" }, t("detection", ctx.detection), ctx.rewrite?.changed ? ` · ${t("rewriteSource", ctx.rewrite.source)}` : ""),
  );
}

const pct = (part, whole) => (whole > 0 ? Math.min(100, (100 * part) / whole) : 0);
const seqList = (seqs) => [...seqs].sort((a, b) => a - b).map(turnRef).join(", ");

/** Turn numbers that the context holds verbatim (only a full context, i.e. a preview, lists items). */
function contextSeqs(ctx) {
  const seqs = new Set();
  for (const layer of ctx?.layers ?? []) {
    for (const item of layer.content ?? []) if (item.seq != null && layer.name !== "constraints") seqs.add(item.seq);
  }
  return seqs;
}

function windowBar(ctx) {
  const segments = ctx.layers
    .filter((layer) => layer.used > 0)
    .map((layer) =>
      el("span", {
        class: `segment layer-${layer.name}`,
        style: { width: `${pct(layer.used, ctx.input_budget)}%` },
        title: `${layerLabel(layer.name, layer.title)}: ${layer.used}`,
      }),
    );
  return el("div", { class: "window-bar", role: "img", "aria-label": t("windowCaption", ctx.total_tokens, ctx.input_budget, ctx.reply_reserve) }, segments);
}

function layerRow(layer, ctx, widest) {
  // A layer can hold budget and nothing yet (no summary so far): drawn empty, its share still shown.
  const notes = layer.used === 0 ? [t("emptyLayer")] : [t("items", layer.items)];
  if (layer.truncated) notes.push(t("truncated"));
  if (layer.dropped_seqs.length) notes.push(t("droppedInLayer", seqList(layer.dropped_seqs)));
  if (layer.name === "current" && messageFate(ctx) === "rewrite") notes.push(t("standalone"));
  const head = el(
    "div",
    { class: "layer-head" },
    el("span", { class: "layer-name", title: layer.title ?? layer.name }, layerLabel(layer.name, layer.title)),
    el(
      "span",
      { class: "layer-track", style: { width: `${Math.max(pct(layer.allocated, widest), 2)}%` } },
      el("span", { class: `layer-fill layer-${layer.name}`, style: { width: `${pct(layer.used, layer.allocated)}%` } }),
    ),
    el("span", { class: "layer-tokens" }, `${layer.used} / ${layer.allocated}`),
  );
  const row = el(
    "div",
    {
      class: `layer${layer.dropped_seqs.length ? " has-dropped" : ""}${layer.used === 0 ? " empty-layer" : ""}`,
      dataset: { layer: layer.name, used: layer.used, allocated: layer.allocated },
    },
    head,
    el("div", { class: "layer-notes" }, notes.join(" · ")),
  );
  if (!layer.content?.length) return row;
  // A preview carries each layer's items: show them on demand.
  const items = layer.content.map((item) =>
    el(
      "li",
      { class: item.truncated ? "truncated" : null },
      el("span", { class: "item-meta" }, [item.seq != null ? turnRef(item.seq) : null, item.role, `${item.tokens} tok`, keyMomentWhy(item, layer)].filter(Boolean).join(" · ")),
      el("span", { class: "item-text" }, item.text),
    ),
  );
  return el("details", { class: "layer-details" }, el("summary", {}, row), el("ol", { class: "items" }, items));
}

/** Why a key-moment item is one: its emotion intensity above the strategy's threshold. */
function keyMomentWhy(item, layer) {
  if (layer.name !== "key_moments" || item.emotion == null) return null;
  return t("keyMomentWhy", item.emotion.toFixed(2), layer.threshold ?? 0.7);
}

/** Why an older turn is in the context: recall's ranker, score, matched terms (or the hit it
 * is the turn before); a key moment's emotion intensity. */
export function recallReason(turn) {
  const parts = [turnRef(turn.seq), layerLabel(turn.layer)];
  if (turn.layer === "key_moments") {
    if (turn.score != null) parts.push(t("keyMomentIntensity", turn.score.toFixed(2)));
    return parts.join(" · ");
  }
  if (turn.score != null) parts.push(t("recallScore", turn.ranker === "bm25+dense" ? t("rankerFused") : "BM25", turn.score));
  if (turn.matched?.length) parts.push(t("recallMatched", turn.matched.join(", ")));
  if (turn.neighbour_of != null) {
    parts.push(t(turn.seq > turn.neighbour_of ? "recallAnswer" : "recallNeighbour", turnRef(turn.neighbour_of)));
  }
  else if (!turn.matched?.length) parts.push(t("recallRelated"));
  return parts.join(" · ");
}

/** The turn's model calls on a time axis (its own and the background jobs' sharing the server):
 * each row a bar from when the call asked for a slot, its wait hatched, then its run. */
function callsCard(ctx) {
  const calls = ctx.trace?.model_calls ?? [];
  const stopped = ctx.trace?.stopped;
  if (!calls.length && !stopped) return null;
  const start = Math.min(0, ...calls.map((c) => c.start_ms));
  const end = Math.max(1, ...calls.map((c) => c.start_ms + c.wait_ms + c.duration_ms));
  const pct = (ms) => `${(100 * (ms - start)) / (end - start)}%`;
  const width = (ms) => `${(100 * ms) / (end - start)}%`;
  return el(
    "details",
    { class: "card model-calls", id: "model-calls", open: true },
    el("summary", {}, t("modelCalls", calls.length)),
    stopped ? el("p", { class: "reply-stopped" }, t("replyStopped", stopped)) : null,
    el(
      "ol",
      { class: "call-timeline" },
      calls.map((c) =>
        el(
          "li",
          { dataset: { priority: c.priority, step: c.step, outcome: c.outcome } },
          el("span", { class: "item-meta" }, t("callRow", c)),
          el(
            "span",
            { class: "call-axis" },
            el("span", { class: "call-wait", style: { left: pct(c.start_ms), width: width(c.wait_ms) } }),
            el("span", { class: "call-run", style: { left: pct(c.start_ms + c.wait_ms), width: width(c.duration_ms) } }),
          ),
        ),
      ),
    ),
  );
}

function recalledCard(ctx) {
  const recalled = ctx.recalled ?? [];
  if (!recalled.length) return null;
  return el(
    "section",
    { class: "card", id: "recalled-card" },
    el("h3", {}, t("recalledTitle")),
    el("p", { class: "muted" }, t("recalledHelp")),
    el(
      "ol",
      { class: "recalled-turns" },
      recalled.map((turn) =>
        el(
          "li",
          { dataset: { seq: turn.seq, layer: turn.layer, matched: (turn.matched ?? []).join(",") } },
          el("span", { class: "item-meta recall-why" }, recallReason(turn)),
          turn.text ? el("span", { class: "item-text" }, turn.text) : null,
        ),
      ),
    ),
  );
}

/** A kept turn's cost: prompt tokens, the part a prompt cache can reuse (the previous request's
 * byte-identical prefix), the cached tokens the endpoint billed, and the money (null: no line). */
function usageLine(usage) {
  if (!usage) return null;
  const parts = [t("usagePrompt", usage.prompt_tokens)];
  if (usage.cacheable_tokens != null) {
    const share = usage.prompt_tokens ? Math.round((100 * usage.cacheable_tokens) / usage.prompt_tokens) : 0;
    parts.push(t("usageCacheable", usage.cacheable_tokens, share));
  }
  if (usage.cached_tokens != null) parts.push(t("usageCached", usage.cached_tokens));
  if (usage.usd != null) parts.push(t("usageMoney", usage.usd.toFixed(5), (usage.session_usd ?? usage.usd).toFixed(4), usage.price_family));
  return el("p", { class: "caption", id: "context-usage" }, parts.join(" · "));
}

/** Draw the context of a turn (`source` {kind: "turn", seq} or {kind: "preview"}); null clears it. */
export function renderContext(ctx, source) {
  const root = $("#context-view");
  if (!ctx) {
    clear(root, el("p", { class: "empty" }, t("emptyInspector")));
    return;
  }
  const widest = Math.max(1, ...ctx.layers.map((layer) => layer.allocated));
  const caption = [
    t("windowCaption", ctx.total_tokens, ctx.input_budget, ctx.reply_reserve),
    `${ctx.exact ? t("exact") : t("estimated")} (${ctx.counter})`,
    `${t("strategy")} ${ctx.strategy}`,
    ctx.mode,
    t("prepareMs", ctx.prepare_ms),
  ];
  const past = source.kind === "past";
  clear(
    root,
    el("p", { class: `context-source ${source.kind}`, id: "context-source", tabindex: "-1", dataset: { turn: source.turn ?? "" } }, sourceLabel(source)),
    el("p", { class: "caption", id: "context-caption", dataset: { total: ctx.total_tokens } }, caption.join(" · ")),
    usageLine(ctx.usage),
    windowBar(ctx),
    el("h3", {}, t("layers")),
    el("div", { class: "layers", id: "layers" }, ctx.layers.map((layer) => layerRow(layer, ctx, widest))),
    recalledCard(ctx),
    rewriteCard(ctx),
    callsCard(ctx),
    past ? diffCard(ctx) : null,
    ctx.messages?.length
      ? el(
          "details",
          { class: "card sent-messages", id: "sent-messages", open: past },
          el("summary", {}, past ? t("messagesReceived", ctx.messages.length, ctx.format) : t("messagesSent", ctx.messages.length, ctx.format)),
          el(
            "ol",
            { class: "items" },
            ctx.messages.map((m) => el("li", { dataset: { role: m.role } }, el("span", { class: "item-meta" }, m.tool_call_id ? `${m.role} ↩ ${m.tool_call_id}` : m.role),
              el("span", { class: "item-text" }, [m.content, ...(m.tool_calls ?? []).map((c) => `🔧 ${c.name}(${c.arguments})`)].filter(Boolean).join("\n")))),
          ),
        )
      : null,
    el(
      "p",
      { class: "dropped", id: "dropped-turns", dataset: { seqs: ctx.dropped_seqs.join(",") } },
      el("strong", {}, `${t("dropped")}: `),
      ctx.dropped_seqs.length ? seqList(ctx.dropped_seqs) : t("noneDropped"),
    ),
  );
  reachScrollers(root);
}

/** A box whose text scrolls inside it must be reachable by keyboard to scroll it (axe-core's
 * scrollable-region-focusable): long items, recalled turns, a long summary. */
function reachScrollers(root) {
  for (const box of root.querySelectorAll(".items li, .recalled-turns li, .summary-text, .constraints")) {
    if (box.scrollHeight > box.clientHeight || box.scrollWidth > box.clientWidth) box.tabIndex = 0;
  }
}

function timeline(session, ctx, currentSeq) {
  const roles = new Map(session.turns.map((turn) => [turn.seq, turn.role]));
  const exchanges = new Map(session.turns.map((turn) => [turn.seq, turn.metadata?.turn || null]));
  const covered = session.stats.summary_covers_seq;
  const dropped = new Set(ctx?.dropped_seqs ?? []);
  const inContext = contextSeqs(ctx);
  const pinned = new Set(session.constraints.map((c) => c.source_seq));
  const cells = [];
  for (let seq = 1; seq <= session.last_seq; seq += 1) {
    const role = roles.get(seq) ?? "unknown";
    const marks = [];
    if (seq <= covered) marks.push(t("legendCovered"));
    if (dropped.has(seq)) marks.push(t("legendDropped"));
    if (inContext.has(seq)) marks.push(t("legendInContext"));
    if (pinned.has(seq)) marks.push(t("legendPinned"));
    if (seq === currentSeq) marks.push(t("legendCurrent"));
    const classes = ["cell", role];
    if (seq <= covered) classes.push("covered");
    if (dropped.has(seq)) classes.push("dropped");
    if (inContext.has(seq)) classes.push("in-context");
    if (pinned.has(seq)) classes.push("pinned");
    if (seq === currentSeq) classes.push("current");
    const exchange = exchanges.get(seq);
    const label = exchange ? t("turn", exchange, role) : turnRef(seq);
    cells.push(el("span", { class: classes.join(" "), dataset: { seq, turn: exchange ?? "" }, title: [label, ...marks].join(" · ") }, exchange ? String(exchange) : "·"));
  }
  const legend = [
    ["covered", t("legendCovered")],
    ["dropped", t("legendDropped")],
    ["pinned", t("legendPinned")],
    ["current", t("legendCurrent")],
    ["in-context", t("legendInContext")],
  ].map(([cls, label]) => el("span", { class: "legend-item" }, el("span", { class: `cell sample ${cls}` }), label));
  return [el("div", { class: "timeline", id: "timeline" }, cells), el("p", { class: "legend" }, legend)];
}

function constraintList(session, pins = session.constraints, id = "constraints") {
  if (!pins.length) return el("p", { class: "muted", id }, t("noConstraints"));
  return el(
    "ul",
    { class: "constraints", id },
    pins.map((c) =>
      el(
        "li",
        { dataset: { key: c.key, sourceSeq: c.source_seq }, title: c.quote },
        el("span", { class: "constraint-value" }, c.value),
        el("span", { class: "constraint-key", title: c.key }, t("pinKey", c.key)),
        el("a", { class: "constraint-source", href: `#turn-${c.source_seq}` }, t("fromTurn", exchangeOf(session, c.source_seq) ?? turnRef(c.source_seq))),
      ),
    ),
  );
}

function jobList(session) {
  const { jobs, pending_jobs: pending } = session.stats;
  const names = [...new Set([...pending, ...Object.keys(jobs)])];
  if (!names.length) return el("p", { class: "muted", id: "jobs" }, t("noJobs"));
  return el(
    "ul",
    { class: "jobs", id: "jobs", dataset: { pending: pending.join(",") } },
    names.map((name) => {
      const stats = jobs[name];
      const failed = stats?.failed > 0;
      return el(
        "li",
        { class: [pending.includes(name) ? "pending" : null, failed ? "failed" : null].filter(Boolean).join(" ") || null, dataset: { job: name } },
        el("strong", { title: name }, t("jobName", name)),
        pending.includes(name) ? el("span", { class: "badge" }, t("pending")) : null,
        stats ? el("span", { class: "muted" }, t("jobLine", stats.ok, stats.failed)) : null,
        stats?.last_error ? el("span", { class: "error-text" }, stats.last_error) : null,
      );
    }),
  );
}

/** The pins: for a past turn, those the model got then (from its trace) beside today's. */
function pinsCards(session, ctx) {
  const now = el("section", { class: "card", id: "pins-now" }, el("h3", {}, t("constraints")), constraintList(session));
  const then = ctx?.trace?.pins;
  if (!then) return now;
  now.querySelector("h3").textContent = t("pinsNow");
  return el(
    "div",
    { class: "then-now" },
    el("section", { class: "card then", id: "pins-then" }, el("h3", {}, t("pinsThen", ctx.trace.turn)), constraintList(session, then, "constraints-then")),
    now,
  );
}

// The last measured storage of a session (id → figures or error): shown again when the
// session is drawn, measured again on request (it reads every record of the session).
const storage = new Map();

function storageTable(figures) {
  const total = figures.total_bytes || 1;
  const rows = Object.entries(figures.bytes).map(([kind, size]) =>
    el(
      "tr",
      { dataset: { kind } },
      el("th", { scope: "row", title: kind }, recordKind(kind)),
      el("td", {}, size.toLocaleString()),
      el("td", {}, `${Math.round((100 * size) / total)}%`),
      el("td", {}, figures.exchanges ? Math.round(size / figures.exchanges).toLocaleString() : "—"),
    ),
  );
  return [
    el("p", { class: "muted", id: "storage-total" }, t("storageTotal", figures.total_bytes, figures.exchanges, figures.per_exchange, figures.raw_text_bytes)),
    el(
      "table",
      { class: "storage", id: "storage-table" },
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, t("storageKind")), el("th", { scope: "col" }, t("storageBytes")), el("th", { scope: "col" }, t("storageShare")), el("th", { scope: "col" }, t("storagePerExchange")))),
      el("tbody", {}, rows),
    ),
  ];
}

/** What the session keeps, by kind of record: measured when asked. */
function storageCard(session) {
  const body = el("div", { id: "storage-body" });
  const show = () => {
    const known = storage.get(session.session_id);
    if (!known) clear(body, el("p", { class: "muted" }, t("storageHelp")));
    else if (known.error) clear(body, el("p", { class: "muted" }, known.error));
    else clear(body, storageTable(known));
  };
  const measure = async () => {
    button.disabled = true;
    try {
      storage.set(session.session_id, await getStorage(session.session_id));
    } catch (error) {
      storage.set(session.session_id, { error: error.message });
    } finally {
      button.disabled = false;
    }
    show();
  };
  const button = el("button", { type: "button", id: "storage-button", onclick: measure }, t("storageMeasure"));
  show();
  return el("section", { class: "card", id: "storage-card" }, el("h3", {}, t("storage")), button, body);
}

/** Draw the session around the context: timeline, constraints, summary, jobs, storage. */
export function renderSession(session, ctx, currentSeq) {
  const root = $("#session-view");
  if (!session) {
    clear(root);
    return;
  }
  const summary = session.summary;
  clear(
    root,
    pinsCards(session, ctx),
    el("section", { class: "card" }, el("h3", {}, t("timeline")), timeline(session, ctx, currentSeq)),
    el(
      "section",
      { class: "card", id: "summary-card" },
      el("h3", {}, t("summary")),
      summary
        ? [el("p", { class: "muted" }, t("summaryCovers", exchangeOf(session, summary.covers_seq) ?? turnRef(summary.covers_seq), summary.version, summary.tokens)), el("p", { class: "quote summary-text" }, summary.text)]
        : el("p", { class: "muted" }, t("noSummary")),
    ),
    el("section", { class: "card" }, el("h3", {}, t("jobs")), jobList(session)),
    storageCard(session),
  );
  reachScrollers(root);
}
